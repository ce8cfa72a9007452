"""Client metrics on a real cluster: scraped while appending and while the server is killed (kill -9) and
restarted, which makes the client reconnect and remount; promtool checks the scrapes."""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from tests.component.client.helpers import Ctx, MemoryCallbacks, eventually, run
from tests.component.client.test_client_metrics import samples, value
from tests.integration.cli.observability import naming_problems, promtool, promtool_problems
from waltz_client import AsyncWaltzClient
from waltz_common.testing.local_cluster import LocalCluster
from waltz_common.testing.zookeeper import ZooKeeperProcess

FAST = {"client.longWaitThresholdSeconds": 0.5, "client.mountTimeout": 60, "client.requestTimeout": 60}
# the restarted server gets its partitions back once the killed one's ZooKeeper session has expired
SHORT_SESSION = {"zookeeper.sessionTimeoutSeconds": 6}
pytestmark = pytest.mark.skipif(promtool() is None, reason="promtool is missing: scripts/bootstrap installs it")


@pytest.fixture(scope="module")
def cluster(zookeeper: ZooKeeperProcess, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path_factory.mktemp("metrics-cluster"), storage_nodes=3, servers=1, partitions=2,
                      cluster_root=f"/test/{uuid.uuid4().hex[:12]}", zookeeper=zookeeper.connect_string,
                      server_overrides=SHORT_SESSION) as c:
        yield c


@pytest.mark.slow  # the restarted server takes its partitions back after its old ZooKeeper session ends (6 s)
def test_metrics_through_a_server_kill_and_restart(cluster: LocalCluster) -> None:
    registry = CollectorRegistry()
    server = cluster.servers[0]
    expositions: list[str] = []
    stop = threading.Event()

    def scraper() -> None:
        while not stop.is_set():
            expositions.append(generate_latest(registry).decode())
            stop.wait(0.05)

    async def main() -> None:
        config = cluster.client_config(**FAST)
        async with AsyncWaltzClient(MemoryCallbacks(), config, metrics_registry=registry) as c:
            await c.wait_mounted()
            thread = threading.Thread(target=scraper)
            thread.start()
            try:
                futures = [await c.submit(Ctx(b"k%d" % i, partition=i)) for i in range(20)]
                server.kill()
                await eventually(lambda: value(samples(registry), "waltz_client_partition_mounted", partition="0") == 0,
                                 30)
                later = asyncio.ensure_future(asyncio.gather(*[_submit(c, Ctx(b"m%d" % i, partition=i))
                                                               for i in range(20)]))
                await asyncio.to_thread(server.start)
                futures += await later
                assert all(await asyncio.gather(*futures))
                ends = {p: await c.high_water_mark(p) for p in (0, 1)}
                await eventually(lambda: all(c.client_high_water_mark(p) == ends[p] for p in (0, 1)), 30)
            finally:
                stop.set()
                thread.join(10)
            end = samples(registry)
            for p in (0, 1):
                assert value(end, "waltz_client_partition_mounted", partition=str(p)) == 1
                assert value(end, "waltz_client_partition_client_high_water_mark", partition=str(p)) == ends[p]
                assert value(end, "waltz_client_partition_lag_transactions", partition=str(p)) == 0
                assert value(end, "waltz_client_remounts_total", partition=str(p)) >= 1
            assert value(end, "waltz_client_reconnects_total") >= 1
            assert value(end, "waltz_client_commits_total") == 40
            assert value(end, "waltz_client_append_latency_seconds_count") == 40
            expositions.append(generate_latest(registry).decode())

    run(main())
    assert len(expositions) > 5
    for text in (expositions[0], expositions[len(expositions) // 2], expositions[-1]):
        assert promtool_problems(text) == ""
        assert naming_problems(text, "waltz_client_") == []


async def _submit(c: AsyncWaltzClient, ctx: Ctx) -> asyncio.Future[bool]:
    return await c.submit(ctx)
