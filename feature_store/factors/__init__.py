"""The live matrix factorisation's factors, written by the trainer, read by the service.

See :mod:`feature_store.factors.base` for what they are and why they skip exports.
"""

from feature_store.factors.base import FactorStore, ItemFactors
from feature_store.factors.factory import open_factors
from feature_store.factors.memory import MemoryFactors

__all__ = ["FactorStore", "ItemFactors", "MemoryFactors", "open_factors"]
