"""The client's metrics under gunicorn's pre-forked workers (issue 43): three workers, a client each made after the
fork, on a real cluster; scraped while HTTP requests submit transactions, /metrics (a MultiProcessCollector over
every worker's values) gives counters that only grow and that sum the workers' (tests/integration/client/
web_workers_app.py is the service). Before, a scrape showed the one worker that answered it (257 -> 16 -> 988)."""

from __future__ import annotations

import http.client
import os
import subprocess
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from waltz_common.testing.local_cluster import LocalCluster, free_port

ROOT = Path(__file__).resolve().parents[3]
WORKERS = 3
REQUESTS = 90


def request(port: int, method: str, path: str) -> tuple[int, str]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        connection.request(method, path)
        response = connection.getresponse()
        return response.status, response.read().decode()
    finally:
        connection.close()


def scrape(port: int) -> dict[str, float]:
    """The unlabelled samples and partition 0's, by name."""
    _, text = request(port, "GET", "/metrics")
    return {s.name: s.value for family in text_string_to_metric_families(text) for s in family.samples
            if s.labels in ({}, {"partition": "0"})}


def test_three_gunicorn_workers_counters_sum_across_workers_and_only_grow(tmp_path: Path, zookeeper: Any) -> None:
    multiproc = tmp_path / "metrics"
    multiproc.mkdir()
    with LocalCluster(tmp_path / "cluster", storage_nodes=1, servers=1, partitions=1,
                      cluster_root=f"/test/{uuid.uuid4().hex[:12]}", zookeeper=zookeeper.connect_string) as cluster:
        config = cluster.write_client_config("client.yaml")
        port = free_port()
        app = "tests/integration/client/web_workers_app.py"
        env = dict(os.environ, PROMETHEUS_MULTIPROC_DIR=str(multiproc), WEB_APP_CLIENT_CONFIG=str(config))
        log = (tmp_path / "gunicorn.log").open("w")
        gunicorn = subprocess.Popen([sys.executable, "-m", "gunicorn", "-w", str(WORKERS), "-b", f"127.0.0.1:{port}",
                                     "--no-control-socket", "-c", app, "tests.integration.client.web_workers_app:app"],
                                    cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 60
            while True:
                assert gunicorn.poll() is None, (tmp_path / "gunicorn.log").read_text()[-3000:]
                try:
                    if request(port, "GET", "/pid")[0] == 200:
                        break
                except OSError:
                    pass
                assert time.monotonic() < deadline, "gunicorn did not answer"
                time.sleep(0.2)
            scrapes: list[dict[str, float]] = []
            with ThreadPoolExecutor(6) as pool:
                submitted = pool.map(lambda _: request(port, "POST", "/submit")[0], range(REQUESTS))
                for _ in range(10):
                    scrapes.append(scrape(port))
                    time.sleep(0.1)
                statuses = list(submitted)
            assert statuses == [200] * REQUESTS
            pids = {request(port, "GET", "/pid")[1] for _ in range(30)}
            assert len(pids) >= 2, "the requests should reach several workers"
            deadline = time.monotonic() + 30
            while (last := scrape(port)).get("waltz_client_applied_transactions_total") != REQUESTS * WORKERS:
                assert time.monotonic() < deadline, f"the workers' metrics did not sum up: {last}"
                time.sleep(0.2)
            scrapes.append(last)
        finally:
            gunicorn.terminate()
            gunicorn.wait(timeout=60)
    assert last["waltz_client_commits_total"] == REQUESTS  # one commit per request, whichever worker took it
    assert last["waltz_client_append_latency_seconds_count"] == REQUESTS
    assert last["waltz_client_partition_mounted"] == 1
    assert last["waltz_client_partition_client_high_water_mark"] == REQUESTS - 1
    assert last["waltz_client_partition_pending_appends"] == 0
    for name in ("waltz_client_commits_total", "waltz_client_applied_transactions_total"):
        seen = [s.get(name, 0) for s in scrapes]
        assert seen == sorted(seen), f"{name} went down between scrapes: {seen}"
