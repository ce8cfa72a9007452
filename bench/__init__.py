"""Benchmarks: one command each, printing a table with a baseline ratio."""
