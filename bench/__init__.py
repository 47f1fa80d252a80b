"""Benchmarks: every figure beside its same-run baseline, as a ratio, also written as JSON."""
