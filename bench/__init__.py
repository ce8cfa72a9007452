"""Benchmarks: one command each, printing a table with a baseline ratio."""

from waltz_common.grpc_env import prefer_fast_io

prefer_fast_io()  # before anything in this package imports gRPC
