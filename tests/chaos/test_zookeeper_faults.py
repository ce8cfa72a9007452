"""ZooKeeper faults on a real cluster under load: kill -9 and restart, expired sessions, a long outage.

Each test has a ZooKeeper of its own (the others share one for the whole run), so that it can kill it
and start it again on the same port and data. Several clients append at once, and the history checker
(tests/chaos/history.py) then looks at what each was told against the log and the replicas.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from tests.chaos.cluster import (
    CLIENT,
    DEADLINE_S,
    Recorder,
    Writer,
    assignment,
    chaos_cluster,
    healthy_owners,
    run,
    until,
)
from tests.chaos.test_faults import SLOW, STEP, check_run, report
from tests.chaos.timing import merged
from waltz_client import AsyncWaltzClient
from waltz_common.testing.fault_proxy import FaultProxy
from waltz_common.testing.local_cluster import LocalCluster, free_port
from waltz_common.testing.zookeeper import ZooKeeperProcess

CLIENTS = 3  # client processes' worth of load: each its own client id, streams and submissions
SUBMITTERS = 4  # writers per client, each submitting one append after another


class Writers:
    """Several Writers, each on a client of its own, seen as one load."""

    def __init__(self, writers: list[Writer]) -> None:
        self.writers = writers

    @property
    def acknowledged(self) -> int:
        return sum(w.acknowledged for w in self.writers)

    def acknowledgement_times(self) -> list[float]:
        return merged(*(w.acked_at for w in self.writers))

    def partitions_acknowledged_since(self, moment: float) -> set[int]:
        return set().union(*(w.partitions_acknowledged_since(moment) for w in self.writers))

    async def acknowledged_at_least(self, count: int, what: str, timeout: float = 120.0) -> int:
        await until(lambda: self.acknowledged >= count, f"{count} acknowledged appends ({what})", timeout)
        return self.acknowledged


@contextlib.asynccontextmanager
async def writing_from(
    cluster: LocalCluster,
    clients: int = CLIENTS,
    submitters: int = SUBMITTERS,
    pace_s: float = 0.002,
    limit: int = 5000,
) -> AsyncIterator[Writers]:
    async with contextlib.AsyncExitStack() as stack:
        writers = []
        for _ in range(clients):
            fed = Recorder()
            config = {**cluster.client_config(), **CLIENT}
            client = await stack.enter_async_context(AsyncWaltzClient(fed, config))
            await client.wait_mounted()
            writers += [Writer(client, fed, pace_s) for _ in range(submitters)]
        for writer in writers:
            writer.start(limit)
        try:
            yield Writers(writers)
        finally:
            await asyncio.gather(*(w.stop() for w in writers))


def on_own_zookeeper(
    tmp_path: Path,
    scenario: Callable[[ZooKeeperProcess, LocalCluster], Awaitable[None]],
    servers: int = 2,
    proxied: bool = False,
    deadline: float = DEADLINE_S,
    **server_overrides: Any,
) -> None:
    zookeeper = ZooKeeperProcess(tmp_path / "zookeeper", port=free_port())
    zookeeper.start()
    try:
        cluster = chaos_cluster(
            tmp_path / "cluster", zookeeper.connect_string, "/waltz/chaos", servers, proxied, **server_overrides
        )
        with cluster:
            run(lambda: scenario(zookeeper, cluster), deadline)
    finally:
        zookeeper.stop()


async def through_a_zookeeper_outage(
    zookeeper: ZooKeeperProcess, cluster: LocalCluster, name: str, down_s: float
) -> dict[int, tuple[int, int]]:
    """kill -9 of ZooKeeper under load, a start on the same port and data down_s later; STEP more appends
    acknowledged after it. Returns the assignment before and after: partition -> (server, generation)."""
    await healthy_owners(cluster)
    before = {p: (o.server_id, o.generation) for p, o in (await asyncio.to_thread(assignment, cluster)).items()}
    async with writing_from(cluster) as load:
        acked = await load.acknowledged_at_least(STEP, f"before the kill ({name})")
        await asyncio.to_thread(zookeeper.kill)
        killed = time.monotonic()
        await asyncio.sleep(down_s)
        during = load.acknowledged - acked
        await asyncio.to_thread(zookeeper.start)
        back = time.monotonic()
        await load.acknowledged_at_least(acked + during + 1, f"the first append after ZooKeeper came back ({name})")
        first = time.monotonic() - back
        acked = await load.acknowledged_at_least(acked + during + STEP, f"after ZooKeeper came back ({name})")
        took = time.monotonic() - back
        await healthy_owners(cluster)
        after = {p: (o.server_id, o.generation) for p, o in (await asyncio.to_thread(assignment, cluster)).items()}
        report(
            name,
            f"ZooKeeper down {back - killed:.1f} s; {during} acknowledged meanwhile (in flight at the kill); the first "
            f"append {first:.1f} s and {STEP} more {took:.1f} s after its restart; {acked} in all; "
            f"(server, generation) {before} -> {after}",
        )
    await check_run(cluster, load.writers, name)
    return {p: after[p][1] - before[p][1] for p in after}


@pytest.mark.slow
def test_kill_9_of_zookeeper_and_a_restart_on_the_same_data_within_the_session_timeout(tmp_path: Path) -> None:
    """ZooKeeper down for 10 s under load with the servers' sessions at 30 s: they survive. The servers go
    on committing while their connection is suspended (issue 32: the store sessions fence an old owner), with
    no partition moved. (The default suite runs the same fault under three client processes' load in
    test_exactly_once.py; WALTZ_SLOW=1 runs this one too.)"""
    if not SLOW:
        pytest.skip("test_exactly_once.py covers it in the default suite")

    async def scenario(zookeeper: ZooKeeperProcess, cluster: LocalCluster) -> None:
        moved = await through_a_zookeeper_outage(zookeeper, cluster, "zookeeper kill", down_s=10)
        assert not any(moved.values()), f"generations moved: {moved}"

    on_own_zookeeper(tmp_path, scenario, **{"zookeeper.sessionTimeoutSeconds": 30.0})


@pytest.mark.slow
def test_zookeeper_down_for_longer_than_the_session_timeout(tmp_path: Path) -> None:
    """ZooKeeper down for 10 s with the servers' sessions at 4 s: they may expire. Each server keeps serving
    its partitions, registers again, and keeps those still assigned to it (issue 32); any partition assigned anew
    gets a higher generation, while clients that have not seen the new generations yet still flush under their
    old mounts (the double commit of
    issue 15 came from answering those flushes). Nothing lost, nothing committed twice. (The default suite
    runs the same fault under three client processes' load in test_exactly_once.py.)"""
    if not SLOW:
        pytest.skip("test_exactly_once.py covers it in the default suite")

    async def scenario(zookeeper: ZooKeeperProcess, cluster: LocalCluster) -> None:
        # whether a server's session expired depends on when kazoo retried: ZooKeeper restores sessions at
        # its start and gives each a full timeout from there; the report shows the generations
        await through_a_zookeeper_outage(zookeeper, cluster, "zookeeper outage", down_s=10)

    on_own_zookeeper(tmp_path, scenario)


def test_a_server_whose_session_expired_reopens_its_partitions_without_a_client_inferring_a_false_failure(
    tmp_path: Path,
) -> None:
    """The ground of the double commit of issue 15, made to happen: one server; the writer's client cannot reach
    ZooKeeper (it keeps its mounts and learns nothing there); two of the three storage nodes stop answering the
    server (blackholed), so its last batches sit at the third; its own ZooKeeper link is blackholed for twice its
    session timeout. Back, it finds its session expired and registers again; alone, it keeps its partitions under
    the same generations, so ZooKeeper shows the client no change (before issue 32 it closed them with those batches
    in doubt and opened them again, to recover once the storage nodes answered again; a reopened partition's answers
    stay covered by test_partition_lifecycle.py). The client, still mounted, flushes and asks for its stalled feed.
    Before, the recovering partition answered the flush with its high-water mark (the client took its pending
    appends for failed: the double commit when recovery kept them, see
    tests/component/server/test_partition_lifecycle.py), and ignored the feed requests: in this run the client then
    waited for ever. Now both get a NOT_READY, and the client mounts again."""

    async def scenario(zookeeper: ZooKeeperProcess, cluster: LocalCluster) -> None:
        await healthy_owners(cluster)
        (server,) = cluster.servers
        assert server.zookeeper_proxy is not None
        before = {p: o.generation for p, o in (await asyncio.to_thread(assignment, cluster)).items()}
        with FaultProxy(zookeeper.connect_string, name="client-zookeeper") as client_zookeeper:
            fed = Recorder()
            config = {
                **cluster.client_config(),
                **CLIENT,
                "zookeeper.connectString": client_zookeeper.address,
                # every pending append is in a batch at the store (storage.maxBatchesInFlight 3): the close sends
                # the client no rejection that would make it mount again before it flushes
                "client.maxConcurrentTransactions": 3,
            }
            async with AsyncWaltzClient(fed, config) as client:
                await client.wait_mounted()
                writer = Writer(client, fed)
                writer.start()
                try:
                    acked = await writer.acknowledged_at_least(STEP, "before the faults")
                    client_zookeeper.blackhole()
                    stalled = [node.proxy for node in cluster.storage[1:]]
                    for proxy in stalled:
                        assert proxy is not None
                        proxy.blackhole()
                    await asyncio.sleep(1.0)  # the server's last batches reach only the first node
                    server.zookeeper_proxy.blackhole()
                    await asyncio.sleep(8.0)  # twice the session timeout: ZooKeeper expires the session
                    server.zookeeper_proxy.heal()
                    await asyncio.sleep(6.0)  # it reopens its partitions; the client flushes meanwhile
                    for proxy in stalled:
                        assert proxy is not None
                        proxy.heal()
                    await healthy_owners(cluster)
                    client_zookeeper.heal()
                    acked = await writer.acknowledged_at_least(acked + STEP, "after every fault healed")
                finally:
                    await writer.stop()
        after = {p: o.generation for p, o in (await asyncio.to_thread(assignment, cluster)).items()}
        # alone, the server takes its partitions back under the same generations: ZooKeeper shows clients nothing
        report("expired session", f"{acked} acknowledged; generations {before} -> {after}")
        await check_run(cluster, writer, "expired session")

    on_own_zookeeper(tmp_path, scenario, servers=1, proxied=True)
