"""Metrics every Waltz process exposes beside its own: the process's (process_cpu_seconds_total,
process_resident_memory_bytes, process_open_fds, ...) and waltz_build_info, which says what runs."""

from __future__ import annotations

import importlib.metadata
import platform

import grpc
from prometheus_client import CollectorRegistry, Gauge, ProcessCollector

DISTRIBUTION = "waltz-python"


def version() -> str:
    """This installation's version (pyproject.toml), or "unknown" when it runs from sources not installed."""
    try:
        return importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def register(registry: CollectorRegistry, component: str) -> None:
    """Add the process metrics and waltz_build_info{component, version, python, grpcio} (always 1) to registry."""
    ProcessCollector(registry=registry)
    info = Gauge(
        "waltz_build_info",
        "What this process runs: the component (server, storage), its version, Python's and grpcio's; always 1",
        ["component", "version", "python", "grpcio"],
        registry=registry,
    )
    info.labels(component, version(), platform.python_version(), grpc.__version__).set(1)
