"""Helpers for tests, the quick start and benchmarks: real processes on loopback."""
