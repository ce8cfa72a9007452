"""Waltz storage node: segment files, control file and the storage gRPC services."""
