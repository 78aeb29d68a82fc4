"""Benchmark data: the loaders (`benchmarks.load_benchmark`) and the `Example` every method answers (`example`)."""
