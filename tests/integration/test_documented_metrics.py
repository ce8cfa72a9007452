"""Every metric name the README and docs/ mention exists on a live endpoint: a server's, a storage node's, or a
client's (metrics_registry), scraped after a few transactions. operations.md once named
`waltz_server_append_requests{result}`, while the endpoint has `waltz_server_append_requests_total`."""

from __future__ import annotations

import asyncio
import re
import uuid
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest

from tests.component.client.helpers import Ctx, MemoryCallbacks
from tests.integration.cli.observability import scrape
from waltz_client import AsyncWaltzClient
from waltz_common.testing.local_cluster import LocalCluster

ROOT = Path(__file__).resolve().parents[2]
METRIC = re.compile(r"\bwaltz_(?:server|storage|client)_[a-z0-9_]*[a-z0-9]")
NOT_METRICS = {"waltz_client_high_water_mark": "the PostgreSQL helper's table (docs/applications.md)"}


def documented() -> dict[str, set[str]]:
    """Metric name -> the pages that mention it."""
    found: dict[str, set[str]] = {}
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for name in METRIC.findall(page.read_text()):
            found.setdefault(name, set()).add(page.name)
    return {name: pages for name, pages in found.items() if name not in NOT_METRICS}


def exposed(exposition: str) -> set[str]:
    """The names an exposition shows: its families (# TYPE) and its samples (a counter's are name_total)."""
    names = set()
    for line in exposition.splitlines():
        if line.startswith("# TYPE "):
            names.add(line.split()[2])
        elif line and not line.startswith("#"):
            names.add(re.split(r"[{ ]", line, maxsplit=1)[0])
    return names


def test_the_documented_names_are_found_and_a_wrong_one_is_not() -> None:
    names = documented()
    assert len(names) >= 30 and "waltz_server_commit_latency_seconds" in names
    assert exposed('# TYPE waltz_server_append_requests_total counter\nwaltz_server_append_requests_total{a="1"} 2.0\n'
                   ) == {"waltz_server_append_requests_total"}


def test_every_documented_metric_exists_on_a_live_endpoint(tmp_path: Path, zookeeper: Any) -> None:
    registry = CollectorRegistry()
    with LocalCluster(tmp_path, storage_nodes=1, servers=1, partitions=1, cluster_root=f"/test/{uuid.uuid4().hex[:12]}",
                      zookeeper=zookeeper.connect_string) as cluster:
        config = {"client.servers": cluster.servers[0].address, "client.mountTimeout": 60,
                  "client.requestTimeout": 60}

        async def transact() -> str:
            async with AsyncWaltzClient(MemoryCallbacks(), config, metrics_registry=registry) as client:
                for i in range(3):
                    assert await client.submit_and_wait(Ctx(b"m%d" % i), timeout=60)
                await client.flush()
                return generate_latest(registry).decode()

        client_exposition = asyncio.run(transact())
        names = exposed(client_exposition) | exposed(scrape(cluster.servers[0].metrics_port))
        names |= exposed(scrape(cluster.storage[0].metrics_port))
    missing = {name: sorted(pages) for name, pages in documented().items() if name not in names}
    assert not missing, f"documented but on no endpoint: {missing}"
