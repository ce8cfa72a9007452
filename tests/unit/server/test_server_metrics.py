"""The server's process-wide metrics: the process's own, waltz_build_info, the ZooKeeper session state."""

from __future__ import annotations

import grpc
from prometheus_client import generate_latest

from waltz_server.metrics import ServerMetrics


def _samples(metrics: ServerMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in metrics.registry.collect()
        for s in family.samples
    }


def test_process_and_build_info():
    samples = _samples(ServerMetrics())
    names = {name for name, _ in samples}
    assert {"process_resident_memory_bytes", "process_cpu_seconds_total", "process_open_fds"} <= names
    ((_, labels),) = [key for key in samples if key[0] == "waltz_build_info"]
    info = dict(labels)
    assert info["component"] == "server" and info["grpcio"] == grpc.__version__ and info["version"]


def test_zookeeper_session_state_is_read_at_each_scrape():
    state = ["CONNECTED"]
    metrics = ServerMetrics()
    metrics.watch_zookeeper(lambda: state[0])

    def current() -> set[str]:
        return {
            dict(labels)["state"]
            for (name, labels), value in _samples(metrics).items()
            if name == "waltz_server_zookeeper_session" and value == 1
        }

    assert current() == {"connected"}
    state[0] = "SUSPENDED"
    assert current() == {"suspended"}
    state[0] = "LOST"
    assert current() == {"lost"}
    assert b'waltz_server_zookeeper_session{state="connected"} 0.0' in generate_latest(metrics.registry)
