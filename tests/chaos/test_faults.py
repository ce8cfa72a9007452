"""Fault injection on a real cluster (ZooKeeper, 3 storage nodes, 2 servers, 4 partitions as processes).

Each test runs a stream of appends with unique payloads through the Python client, does its
faults by kill -9, and then checks what a user cares about (tests/chaos/history.py): every
acknowledged append is in the log exactly once, nothing is in it twice or unasked for, ids are
dense per partition up to the high-water mark, what the writer was fed agrees with what a fresh
consumer reads (one id never names two payloads), and the three replicas end with identical
records (through their admin ports) and identical data files past the header (after the stop).

Runs are bounded (a few hundred appends, one fault each); WALTZ_SLOW=1 runs 500 appends per
step and three fault cycles per test.
"""

from __future__ import annotations

import asyncio
import os
import resource
import signal
import time
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from tests.chaos.cluster import (
    CLIENT,
    PARTITIONS,
    Writer,
    all_partitions,
    assignment,
    chaos_cluster,
    healthy_owners,
    read_everything,
    replica_records,
    run,
    segment_bodies,
    servers_by_id,
    sessions,
    until,
    writing,
)
from tests.chaos.history import check, compare_replicas
from waltz_common.testing.local_cluster import LocalCluster, ServerNode
from waltz_common.testing.zookeeper import ZooKeeperProcess
from waltz_common.types import Record

SLOW = os.environ.get("WALTZ_SLOW") == "1"
STEP = 500 if SLOW else 100  # acknowledged appends between one event of a scenario and the next
CYCLES = 3 if SLOW else 1  # faults per run


def report(name: str, text: str) -> None:
    print(f"[chaos] {name}: {text}")


def on_cluster(
    zookeeper: ZooKeeperProcess,
    cluster_root: str,
    workdir: Path,
    scenario: Callable[[LocalCluster], Awaitable[None]],
    tls: bool = False,
    servers: int = 2,
    proxied: bool = False,
    **server_overrides: Any,
) -> None:
    """Run the scenario on a fresh cluster (mutual TLS on every channel if tls); once it stopped, compare the
    replicas' data files."""
    with chaos_cluster(
        workdir, zookeeper.connect_string, cluster_root, servers, proxied, tls, **server_overrides
    ) as cluster:
        run(lambda: scenario(cluster))
    for pid in range(PARTITIONS):
        bodies = segment_bodies(cluster, pid)
        assert len(set(bodies.values())) == 1, {name: len(body) for name, body in bodies.items()}


async def check_run(
    cluster: LocalCluster, writer: Writer | Sequence[Writer], name: str, read_timeout: float = 120.0
) -> None:
    """The common end of every scenario: the history of every writer against the log and the replicas."""
    writers = [writer] if isinstance(writer, Writer) else list(writer)
    log = await read_everything({**cluster.client_config(), **CLIENT}, read_timeout)
    appends = [a for w in writers for a in w.appends]
    verdict = check(appends, log, PARTITIONS)
    report(name, verdict.summary())
    assert not verdict.problems, verdict.problems
    assert verdict.acknowledged == verdict.submitted, "appends failed: " + str(
        [(a.seq, a.outcome) for a in appends if a.outcome is not True][:10]
    )
    for each in writers:
        assert not each.fed.problems, each.fed.problems
        for pid, records in each.fed.log.items():
            assert records == log[pid][: len(records)], f"partition {pid}: the writer was fed other records"
    await identical_replicas(cluster, log)


async def identical_replicas(cluster: LocalCluster, log: dict[int, list[Record]]) -> None:
    """Wait until every replica holds exactly the log (a restarted one catches up in the background)."""
    problems: list[str] = []

    def identical() -> bool:
        problems[:] = compare_replicas(replica_records(cluster), log)
        return not problems

    try:
        await until(identical, "three identical replicas", timeout=90)
    except AssertionError:
        raise AssertionError(problems) from None


def assert_new_sessions_under_the_same_owners(
    before: dict[int, tuple[int, int, int]], during: dict[int, tuple[int, int, int]]
) -> None:
    """A replica's failure ended every partition's store session (all are on all three nodes), and no
    partition moved: (generation, session, high-water mark) per partition, before and during the fault."""
    for pid, (generation, session, _) in during.items():
        assert generation == before[pid][0], f"partition {pid} moved: {before} -> {during}"
        assert session > before[pid][1], f"partition {pid} kept its store session: {before} -> {during}"


async def sessions_ended(
    cluster: LocalCluster, before: dict[int, tuple[int, int, int]], deadline: float
) -> dict[int, tuple[int, int, int]]:
    """The partitions' (generation, session, high-water mark) once every one's store session changed since before,
    or as they are at deadline (time.monotonic())."""
    while True:
        during = await sessions(cluster)
        changed = all(p in before and during[p][:2] != before[p][:2] for p in during)
        if changed or time.monotonic() >= deadline:
            return during
        await asyncio.sleep(0.2)


async def through_a_replica_fault(
    cluster: LocalCluster,
    writer: Writer,
    acked: int,
    fault: str,
    inflict: Callable[[], object],
    mend: Callable[[], object],
    within: float = 120.0,
) -> int:
    """Inflict a fault on one storage node: STEP more appends must be acknowledged within `within` s on the
    other two replicas, and the fault must have ended every store session without moving a partition (within
    `within` s too, and 25 s at least); then mend it and see STEP more. The acknowledged count at the end."""
    before = await sessions(cluster)
    await asyncio.to_thread(inflict)
    started = time.monotonic()
    try:
        faulty_at = await writer.acknowledged_at_least(acked + STEP, f"with {fault}", within)
        took = time.monotonic() - started
        # A session may commit a few batches at the two others before the fault ends it (a frozen node: until
        # storage.replicaLagTimeout); on a busy machine STEP appends can be acknowledged first. Under the 30 s
        # request timeout, which the frozen node's case must not need.
        during = await sessions_ended(cluster, before, started + max(within, 25.0))
    finally:
        await asyncio.to_thread(mend)
    after = await writer.acknowledged_at_least(faulty_at + STEP, f"after {fault} was mended")
    report(
        fault,
        f"{STEP} appends in {took:.1f} s from {acked} acknowledged, {after} once mended; (generation, session, "
        f"hwm) {before} -> {during}",
    )
    assert_new_sessions_under_the_same_owners(before, during)
    return after


def test_appends_commit_with_dense_ids_on_every_partition(
    zookeeper: ZooKeeperProcess, cluster_root: str, tmp_path: Path
) -> None:
    async def scenario(cluster: LocalCluster) -> None:
        owners = await healthy_owners(cluster)
        held = sorted((p.partition_id, sid, p.generation) for sid, a in owners.items() for p in a.partitions)
        report("dense", f"(partition, server, generation): {held}")
        async with writing(cluster, limit=4 * STEP) as writer:
            await writer.acknowledged_at_least(4 * STEP, "the whole run")
        await check_run(cluster, writer, "dense")

    on_cluster(zookeeper, cluster_root, tmp_path, scenario)


@pytest.mark.parametrize("tls", [False, True], ids=["plaintext", "tls"])
def test_kill_9_of_a_storage_node_during_appends(
    zookeeper: ZooKeeperProcess, cluster_root: str, tmp_path: Path, tls: bool
) -> None:
    async def scenario(cluster: LocalCluster) -> None:
        await healthy_owners(cluster)
        async with writing(cluster) as writer:
            acked = await writer.acknowledged_at_least(STEP, "before the first kill")
            for cycle in range(CYCLES):
                victim = cluster.storage[(1 + cycle) % len(cluster.storage)]
                acked = await through_a_replica_fault(
                    cluster, writer, acked, f"{victim.name} killed", victim.kill, victim.start
                )
        await check_run(cluster, writer, "storage kill")

    on_cluster(zookeeper, cluster_root, tmp_path, scenario, tls)


@pytest.mark.parametrize("tls", [False, True], ids=["plaintext", "tls"])
def test_kill_9_of_the_owning_server_during_appends(
    zookeeper: ZooKeeperProcess, cluster_root: str, tmp_path: Path, tls: bool
) -> None:
    async def scenario(cluster: LocalCluster) -> None:
        await healthy_owners(cluster)
        async with writing(cluster) as writer:
            acked = await writer.acknowledged_at_least(STEP, "before the first kill")
            killed: list[ServerNode] = []
            for cycle in range(CYCLES):
                if killed:  # bring the killed server back (under a new server id) before the next kill
                    await asyncio.to_thread(killed[-1].start)
                    await healthy_owners(cluster)
                    acked = await writer.acknowledged_at_least(acked + STEP, "with both servers")
                before = await asyncio.to_thread(assignment, cluster)
                servers = await servers_by_id(cluster)
                assert len(servers) == 2 and len({o.server_id for o in before.values()}) == 2
                victim_id = before[cycle % PARTITIONS].server_id
                moved = sorted(pid for pid, o in before.items() if o.server_id == victim_id)
                killed.append(servers[victim_id])
                await asyncio.to_thread(killed[-1].kill)
                killed_at = acked
                acked = await writer.acknowledged_at_least(killed_at + STEP, "after the kill")
                owners = await healthy_owners(cluster)
                after = await asyncio.to_thread(assignment, cluster)
                generations = [{p: o.generation for p, o in sorted(a.items())} for a in (before, after)]
                report(
                    "server kill",
                    f"killed server {victim_id} (owner of {moved}) at {killed_at} acknowledged, {acked} "
                    f"acknowledged by then; generations {generations[0]} -> {generations[1]}; the survivor "
                    f"reports (generation, session, hwm) {await sessions(cluster)}",
                )
                survivor = next(sid for sid in servers if sid != victim_id)
                assert {o.server_id for o in after.values()} == {survivor}
                for pid in range(PARTITIONS):
                    if pid in moved:
                        assert after[pid].generation > before[pid].generation, (pid, before, after)
                    else:
                        assert after[pid] == before[pid], (pid, before, after)
                status = {p.partition_id: p.generation for p in owners[survivor].partitions}
                assert status == {p: o.generation for p, o in after.items()}
        await check_run(cluster, writer, "server kill")

    on_cluster(zookeeper, cluster_root, tmp_path, scenario, tls)


def test_kill_9_of_a_storage_node_and_of_a_server_then_both_restart_during_appends(
    zookeeper: ZooKeeperProcess, cluster_root: str, tmp_path: Path
) -> None:
    """The new owner recovers with a replica offline; then the storage node and the server come back
    (the server under a new id, so partitions move to it again, each time with a higher generation)."""

    async def scenario(cluster: LocalCluster) -> None:
        storage_victim = cluster.storage[2]
        await healthy_owners(cluster)
        start = await asyncio.to_thread(assignment, cluster)
        victim_id = start[0].server_id
        server_victim = (await servers_by_id(cluster))[victim_id]
        async with writing(cluster) as writer:
            acked = await writer.acknowledged_at_least(STEP, "before the kills")
            await asyncio.to_thread(storage_victim.kill)
            acked = await writer.acknowledged_at_least(acked + STEP // 2, f"with {storage_victim.name} down")
            await asyncio.to_thread(server_victim.kill)
            acked = await writer.acknowledged_at_least(acked + STEP, "with a server and a storage node down")
            moved = await asyncio.to_thread(assignment, cluster)
            await asyncio.to_thread(storage_victim.start)
            await asyncio.to_thread(server_victim.start)
            acked = await writer.acknowledged_at_least(acked + STEP, "after both restarted")
            await healthy_owners(cluster)
            back = await asyncio.to_thread(assignment, cluster)
            acked = await writer.acknowledged_at_least(acked + STEP // 2, "once rebalanced")
        owners = [{p: (o.server_id, o.generation) for p, o in sorted(a.items())} for a in (start, moved, back)]
        report("storage+server", f"(server, generation) {owners[0]} -> {owners[1]} -> {owners[2]}; {acked} acked")
        assert len({o.server_id for o in moved.values()}) == 1
        for pid in range(PARTITIONS):
            assert start[pid].generation <= moved[pid].generation <= back[pid].generation
            if start[pid].server_id == victim_id:
                assert moved[pid].generation > start[pid].generation
            if back[pid].server_id != moved[pid].server_id:
                assert back[pid].generation > moved[pid].generation
        await check_run(cluster, writer, "storage+server")

    on_cluster(zookeeper, cluster_root, tmp_path, scenario)


def test_kill_9_of_two_storage_nodes_stops_acknowledgements_until_a_majority_is_back(
    zookeeper: ZooKeeperProcess, cluster_root: str, tmp_path: Path
) -> None:
    """Never acknowledge on a minority: with two of three replicas gone, at most the appends already
    in flight (5 per partition, the client's limit) may still be acknowledged; one node back makes a
    majority and appends go on; the other comes back and catches up."""

    async def scenario(cluster: LocalCluster) -> None:
        first, second = cluster.storage[0], cluster.storage[2]
        await healthy_owners(cluster)
        async with writing(cluster) as writer:
            acked = await writer.acknowledged_at_least(STEP, "before the kills")
            await asyncio.to_thread(first.kill)
            await asyncio.to_thread(second.kill)
            killed_at = writer.acknowledged
            in_flight = PARTITIONS * writer.client.config.max_concurrent_transactions
            await all_partitions(cluster, healthy=False)
            await asyncio.sleep(2.0)  # give a wrong acknowledgement time to show up
            stalled_at = writer.acknowledged
            assert stalled_at <= killed_at + in_flight, (killed_at, stalled_at)
            await asyncio.to_thread(first.start)
            acked = await writer.acknowledged_at_least(stalled_at + STEP, f"with {first.name} back")
            await asyncio.to_thread(second.start)
            acked = await writer.acknowledged_at_least(acked + STEP, f"with {second.name} back")
        report(
            "quorum loss",
            f"killed {first.name} and {second.name} at {killed_at} acknowledged; {stalled_at} while they were "
            f"down; {acked} after both came back",
        )
        await check_run(cluster, writer, "quorum loss")

    on_cluster(zookeeper, cluster_root, tmp_path, scenario)


def test_a_frozen_storage_node_holds_appends_back_only_until_the_replica_lag_timeout(
    zookeeper: ZooKeeperProcess, cluster_root: str, tmp_path: Path
) -> None:
    """SIGSTOP: a hung disk or a paused machine. Its connections stay up and it answers nothing, so only
    storage.replicaLagTimeout (5 s by default) ends the store sessions it holds back, not the 30 s request
    timeout; the next sessions go on with the other two, and it catches up once it runs again."""

    async def scenario(cluster: LocalCluster) -> None:
        await healthy_owners(cluster)
        async with writing(cluster) as writer:
            acked = await writer.acknowledged_at_least(STEP, "before the freeze")
            victim = cluster.storage[2]
            process = victim.process
            assert process is not None
            await through_a_replica_fault(
                cluster,
                writer,
                acked,
                f"{victim.name} stopped",
                partial(process.send_signal, signal.SIGSTOP),
                partial(process.send_signal, signal.SIGCONT),
                within=20,
            )
        await check_run(cluster, writer, "storage freeze")

    on_cluster(zookeeper, cluster_root, tmp_path, scenario)


def test_a_frozen_owning_server_loses_its_partitions_and_does_no_harm_when_it_wakes(
    zookeeper: ZooKeeperProcess, cluster_root: str, tmp_path: Path
) -> None:
    """SIGSTOP of a server: its ZooKeeper session expires, its partitions move to the other server with a
    higher generation, and appends go on there. Woken, it still has its client streams and its store
    sessions: whatever it does then must neither acknowledge an append the log does not hold nor break
    the new owner's sessions (the storage nodes fence its older session ids)."""

    async def scenario(cluster: LocalCluster) -> None:
        await healthy_owners(cluster)
        async with writing(cluster) as writer:
            acked = await writer.acknowledged_at_least(STEP, "before the freeze")
            before = await asyncio.to_thread(assignment, cluster)
            servers = await servers_by_id(cluster)
            victim_id = before[0].server_id
            victim = servers[victim_id]
            moved = sorted(pid for pid, o in before.items() if o.server_id == victim_id)
            assert victim.process is not None
            frozen_at = acked
            victim.process.send_signal(signal.SIGSTOP)
            try:
                await until(
                    lambda: all(o.server_id != victim_id for o in assignment(cluster).values()),
                    f"server {victim_id}'s partitions moved",
                    60,
                )
                frozen_acked = await writer.acknowledged_at_least(acked + STEP, f"with server {victim_id} frozen")
            finally:
                victim.process.send_signal(signal.SIGCONT)
            acked = await writer.acknowledged_at_least(frozen_acked + STEP, f"after server {victim_id} woke")
            await healthy_owners(cluster)
            after = await asyncio.to_thread(assignment, cluster)
            acked = await writer.acknowledged_at_least(acked + STEP, "with both servers again")
        report(
            "server freeze",
            f"froze server {victim_id} (owner of {moved}) at {frozen_at} acknowledged, woke it at {frozen_acked}, "
            f"{acked} by the end; generations "
            f"{ {p: o.generation for p, o in before.items()} } -> { {p: o.generation for p, o in after.items()} }",
        )
        for pid in moved:
            assert after[pid].generation > before[pid].generation, (pid, before, after)
        await check_run(cluster, writer, "server freeze")

    on_cluster(zookeeper, cluster_root, tmp_path, scenario)


def test_a_storage_node_whose_writes_fail_leaves_the_write_set_and_catches_up_once_they_work(
    zookeeper: ZooKeeperProcess, cluster_root: str, tmp_path: Path
) -> None:
    """A full or failing disk: the node's file size limit (RLIMIT_FSIZE, lowered from outside) makes
    every append it gets fail with EFBIG, while it still answers reads. Its failure ends the store
    sessions once; the next ones go on with the other two (it cannot catch up meanwhile), and once its
    writes work again it catches up and the three replicas end identical."""

    async def scenario(cluster: LocalCluster) -> None:
        await healthy_owners(cluster)
        async with writing(cluster) as writer:
            acked = await writer.acknowledged_at_least(STEP, "before the write errors")
            victim = cluster.storage[2]
            assert victim.process is not None
            pid = victim.process.pid
            smallest = min(f.stat().st_size for f in victim.directory.glob("*/*.seg"))
            hard = resource.prlimit(pid, resource.RLIMIT_FSIZE)[1]
            await through_a_replica_fault(
                cluster,
                writer,
                acked,
                f"{victim.name} failing every write",
                partial(resource.prlimit, pid, resource.RLIMIT_FSIZE, (smallest, hard)),
                partial(resource.prlimit, pid, resource.RLIMIT_FSIZE, (hard, hard)),
                within=30,
            )
        await check_run(cluster, writer, "write errors")

    on_cluster(zookeeper, cluster_root, tmp_path, scenario)
