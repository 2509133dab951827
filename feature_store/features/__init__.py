"""Feature columns, their declared sources, schema, stable keys, and extraction.

Importing this package registers every standard source (the categorical and
multi-valued ones in ``columns``, the dense ones in ``dense``).
"""

from feature_store.features.batch import BatchFeatures
from feature_store.features.columns import (
    MISSING,
    Attention,
    Categorical,
    Column,
    Crossed,
    Dense,
    FeatureRow,
    MultiValued,
)
from feature_store.features.extract import FeatureExtractor
from feature_store.features.keys import KeyHasher, cross_keys, feature_key
from feature_store.features.schema import WIDE_TABLE, FeatureSchema, default_schema
from feature_store.features.sources import SOURCES, Scope, Source, source
from feature_store.features.values import FeatureValues, ValueLayout, layout_of

__all__ = [
    "MISSING",
    "WIDE_TABLE",
    "Attention",
    "BatchFeatures",
    "Categorical",
    "Column",
    "Crossed",
    "Dense",
    "FeatureExtractor",
    "FeatureRow",
    "FeatureSchema",
    "FeatureValues",
    "KeyHasher",
    "MultiValued",
    "SOURCES",
    "Scope",
    "Source",
    "ValueLayout",
    "cross_keys",
    "default_schema",
    "feature_key",
    "layout_of",
    "source",
]
