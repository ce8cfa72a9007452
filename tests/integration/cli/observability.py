"""Checks of a running component's operability surface: /metrics (promtool + naming) and gRPC health/reflection."""

from __future__ import annotations

import shutil
import subprocess
import time
import urllib.request

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2
from prometheus_client.parser import text_string_to_metric_families

# Label names whose values would be unbounded (design.md section 6: no transaction or client ids as labels).
HIGH_CARDINALITY_LABELS = {"client", "client_id", "transaction", "transaction_id", "txn", "req_id", "seq_num"}
FOREIGN_PREFIXES = ("process_", "python_", "grpc_")
SHARED_NAMES = ("waltz_build_info",)  # every Waltz process, told apart by its component label


def promtool() -> str | None:
    return shutil.which("promtool")


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as response:
        return response.read().decode()


def promtool_problems(exposition: str) -> str:
    """promtool check metrics output; empty when the exposition is clean."""
    tool = promtool()
    assert tool is not None
    result = subprocess.run(
        [tool, "check", "metrics"], input=exposition, capture_output=True, text=True, timeout=60, check=False
    )
    return "" if result.returncode == 0 else (result.stdout + result.stderr).strip()


def naming_problems(exposition: str, prefix: str) -> list[str]:
    """Our conventions: the component's waltz_ prefix, counters in _total, base units, bounded labels."""
    problems = []
    ours = 0
    for family in text_string_to_metric_families(exposition):
        name = family.name
        if name.startswith(FOREIGN_PREFIXES) or name in SHARED_NAMES:
            continue
        if not name.startswith(prefix):
            problems.append(f"{name}: not prefixed {prefix}")
            continue
        ours += 1
        if name.endswith("_created"):
            continue
        if family.type == "counter" and family.samples and not any(s.name.endswith("_total") for s in family.samples):
            problems.append(f"{name}: a counter without _total")
        if name.endswith(("_ms", "_milliseconds", "_kb", "_mb")):
            problems.append(f"{name}: not in base units")
        labels = {k for s in family.samples for k in s.labels if k not in ("le", "quantile")}
        if labels & HIGH_CARDINALITY_LABELS:
            problems.append(f"{name}: high-cardinality labels {sorted(labels & HIGH_CARDINALITY_LABELS)}")
    if not ours:
        problems.append(f"no {prefix}* metric at all")
    return problems


def health_status(target: str, settle_s: float = 15.0) -> str:
    """The overall ("") gRPC health status of the server at target, once SERVING or after settle_s: a storage node
    turns ready only once it holds what ZooKeeper assigns it and a store session counts it in (read every 2 s)."""
    deadline = time.monotonic() + settle_s
    with grpc.insecure_channel(target) as channel:
        while True:
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""), timeout=10)
            if reply.status == health_pb2.HealthCheckResponse.SERVING or time.monotonic() > deadline:
                return str(health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status))
            time.sleep(0.2)


def reflected_services(target: str, version: str = "v1") -> set[str]:
    """The services the server at target lists through gRPC reflection (version v1 or v1alpha: their messages
    are the same on the wire, so v1alpha's classes serve both)."""
    with grpc.insecure_channel(target) as channel:
        info = channel.stream_stream(
            f"/grpc.reflection.{version}.ServerReflection/ServerReflectionInfo",
            request_serializer=reflection_pb2.ServerReflectionRequest.SerializeToString,
            response_deserializer=reflection_pb2.ServerReflectionResponse.FromString,
        )
        request = reflection_pb2.ServerReflectionRequest(list_services="")
        (reply,) = list(info(iter([request]), timeout=10))
    return {s.name for s in reply.list_services_response.service}
