"""Benchmarks: each prints a human table and, last, one JSON line."""
