"""activity."""
