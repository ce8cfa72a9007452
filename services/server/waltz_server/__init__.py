"""Waltz server: partition ownership, store sessions, recovery, locks and feeds."""

from waltz_common.grpc_env import prefer_fast_io

prefer_fast_io()  # before anything in this package imports gRPC
