"""Waltz storage node: segment files, control file and the storage gRPC services."""

from waltz_common.grpc_env import prefer_fast_io

prefer_fast_io()  # before anything in this package imports gRPC
