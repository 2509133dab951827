"""Exported models: the registry of versions, the ONNX contracts of the ranker and the
towers, and how scores are judged (AUC, scored samples)."""
