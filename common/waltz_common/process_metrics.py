"""Metrics every Waltz process exposes beside its own: the process's (process_cpu_seconds_total,
process_resident_memory_bytes, process_open_fds, ...) and waltz_build_info, which says what runs."""

from __future__ import annotations

import platform

import grpc
from prometheus_client import CollectorRegistry, Gauge, ProcessCollector

from waltz_common import build_info


def version() -> str:
    """This installation's version: pyproject.toml's, with the commit it was built from (waltz_common.build_info)."""
    return build_info.current().version


def register(registry: CollectorRegistry, component: str) -> None:
    """Add the process metrics and waltz_build_info{component, version, commit, python, grpcio} (always 1)."""
    ProcessCollector(registry=registry)
    info = Gauge(
        "waltz_build_info",
        "What this process runs: the component (server, storage), its version and commit, Python's and grpcio's "
        "versions; always 1",
        ["component", "version", "commit", "python", "grpcio"],
        registry=registry,
    )
    build = build_info.current()
    info.labels(component, build.version, build.commit, platform.python_version(), grpc.__version__).set(1)
