"""feature_store."""
