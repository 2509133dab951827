"""Operating a deployment: the control channel to trainers and the trainer's metrics time series."""
