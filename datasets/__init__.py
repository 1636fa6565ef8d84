"""Deterministic data generators and small bundled samples for demos, tests and benchmarks."""
