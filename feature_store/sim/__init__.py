"""A simulated world with known tastes, for the demo, tests and benchmarks."""
