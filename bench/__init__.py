"""Benchmarks that compare the engine against baselines in one run and print tables."""
