"""The online trainer: event log -> labelled samples -> Wide&Deep -> ONNX versions.

Imports torch; only ``vidrec train``, the embedded ``vidrec up`` and ``vidrec
eval`` load it, through the composition root (``app.wiring``).
"""

from trainer.component import TrainerComponent
from trainer.labels import Joiner, LabelPolicy, Sample
from trainer.loop import OnlineTrainer
from trainer.model import WideDeep

__all__ = ["Joiner", "LabelPolicy", "OnlineTrainer", "Sample", "TrainerComponent", "WideDeep"]
