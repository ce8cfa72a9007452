"""The shipped Grafana dashboard's queries in a real Prometheus (Debian's binary) scraping a healthy local cluster and
an application's client under a light load: every panel's every query returns data, so no panel reads "No data" on
a healthy cluster, and the process panels count each component's processes up."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, start_http_server

from tests.component.client.helpers import Ctx, MemoryCallbacks, run
from waltz_client import AsyncWaltzClient
from waltz_common.testing.local_cluster import LocalCluster, free_port

from .test_alerts_prometheus import Prometheus, pytestmark  # noqa: F401  (skipped without prometheus)

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "helm/dashboards/waltz.json"
RATE_INTERVAL = "20s"  # Grafana's $__rate_interval at a 1 s scrape interval is a few scrapes


def dashboard_queries() -> list[tuple[str, str]]:
    """(panel title, query) of every target of every panel, with the dashboard's variables as Grafana fills them
    with every partition selected."""
    found = []
    for panel in json.loads(DASHBOARD.read_text())["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"].replace("$partition", ".*").replace("$__rate_interval", RATE_INTERVAL)
            found.append((panel["title"], expr))
    return found


def test_every_dashboard_query_has_data_on_a_healthy_cluster(tmp_path: Path, zookeeper: Any, cluster_root: str):
    registry = CollectorRegistry()
    client_port = free_port()
    http, http_thread = start_http_server(client_port, addr="127.0.0.1", registry=registry)
    with LocalCluster(tmp_path / "cluster", storage_nodes=3, servers=1, partitions=2,
                      zookeeper=zookeeper.connect_string, cluster_root=cluster_root) as cluster:
        workdir = tmp_path / "prometheus"
        workdir.mkdir()
        prometheus = Prometheus(workdir, {
            "waltz-server": [f"127.0.0.1:{s.metrics_port}" for s in cluster.servers],
            "waltz-storage": [f"127.0.0.1:{n.metrics_port}" for n in cluster.storage],
            "waltz-client": [f"127.0.0.1:{client_port}"],
        }, {"server": 1, "storage": 3, "replication": 3})
        empty: dict[str, list[str]] = {}
        up: dict[str, float] = {}
        try:
            stop = threading.Event()

            async def main() -> None:
                async with AsyncWaltzClient(MemoryCallbacks(), cluster.client_config(),
                                            metrics_registry=registry) as client:
                    await client.wait_mounted()

                    async def load() -> None:
                        n = 0
                        while not stop.is_set():  # a light, steady load on both partitions
                            await asyncio.gather(*[client.submit_and_wait(Ctx(b"k%d" % (n + i), partition=i % 2))
                                                   for i in range(4)])
                            n += 4
                            await asyncio.sleep(0.02)

                    loader = asyncio.ensure_future(load())
                    try:
                        empty.update(await asyncio.to_thread(queries_without_data, prometheus))
                        up.update(await asyncio.to_thread(processes_up, prometheus))
                    finally:
                        stop.set()
                        await loader

            run(main())
        finally:
            prometheus.process.stop()
            http.shutdown()
            http_thread.join(10)
    assert empty == {}, f"panels without data on a healthy cluster: {empty}"
    # the client's process reports no waltz_build_info: it is the application's, not a Waltz component
    assert up == {"server up": 1.0, "server down": 0.0, "storage up": 3.0, "storage down": 0.0}


def processes_up(prometheus: Prometheus) -> dict[str, float]:
    """'COMPONENT up|down' -> processes, from the dashboard's own panel."""
    panel = [expr for title, expr in dashboard_queries() if title == "Processes up and down"]
    assert len(panel) == 2, "the dashboard's panel of processes up and down"
    counts = {}
    for state, expr in zip(("up", "down"), panel, strict=True):
        for series in prometheus.api("query", query=expr)["result"]:
            counts[f"{series['metric']['component']} {state}"] = float(series["value"][1])
    return counts


def queries_without_data(prometheus: Prometheus) -> dict[str, list[str]]:
    """Wait until the rates have a few scrapes to go on, then: panel title -> its queries that return nothing."""
    prometheus.wait("every target scraped", lambda: len([
        t for t in prometheus.api("targets")["activeTargets"] if t["health"] == "up"]) == 5, timeout=60)
    time.sleep(8)  # several scrapes of a steady load: rate() needs two samples inside its window
    empty: dict[str, list[str]] = {}
    deadline = time.monotonic() + 30
    while True:
        empty = {}
        for title, expr in dashboard_queries():
            if not prometheus.api("query", query=expr)["result"]:
                empty.setdefault(title, []).append(expr)
        if not empty or time.monotonic() > deadline:
            return empty
        time.sleep(1)
