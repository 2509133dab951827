"""Feature columns, their schema, stable keys, and batch extraction."""

from feature_store.features.columns import (
    MISSING,
    Categorical,
    Column,
    Crossed,
    Dense,
    FeatureRow,
    MultiValued,
)
from feature_store.features.extract import BatchFeatures, FeatureExtractor
from feature_store.features.keys import KeyHasher, cross_keys, feature_key
from feature_store.features.schema import WIDE_TABLE, FeatureSchema, default_schema

__all__ = [
    "MISSING",
    "WIDE_TABLE",
    "BatchFeatures",
    "Categorical",
    "Column",
    "Crossed",
    "Dense",
    "FeatureExtractor",
    "FeatureRow",
    "FeatureSchema",
    "KeyHasher",
    "MultiValued",
    "cross_keys",
    "default_schema",
    "feature_key",
]
