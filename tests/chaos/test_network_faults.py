"""Network faults between real processes, through the FaultProxy of a proxied LocalCluster, under load.

Each test cuts (connections reset, new ones refused) or blackholes (connections up, nothing flows) a link,
or slows it, holds the fault, heals it, and reports the time from the fault and from its healing to the next
acknowledged append and the longest stretch without one (tests/chaos/timing.py); the history checker
(tests/chaos/test_faults.check_run) then looks at what the writers were told against the log and the replicas.

- a server partitioned from one storage node, then from two, then from all three (one server, so that the
  proxy in front of a node is the server's link to it): with one gone the other two go on; with two or three
  gone nothing is acknowledged beyond the appends already in flight, and appends go on once healed;
- a client partitioned from one of the two servers (the server's client port proxy);
- a slow replica: 100 ms per message on one storage node's link; appends go on, the replica stays in the write set;
- a server cut off from ZooKeeper (its ZooKeeper link blackholed) past its session timeout while clients
  keep writing: its partitions move to the other server, and it comes back once healed.
"""

from __future__ import annotations

import asyncio
import time
from functools import partial
from pathlib import Path

import pytest

from tests.chaos.cluster import (
    PARTITIONS,
    assignment,
    healthy_owners,
    server_partitions,
    servers_by_id,
    sessions,
    until,
    writing,
)
from tests.chaos.test_faults import STEP, check_run, on_cluster, report
from tests.chaos.test_zookeeper_faults import writing_from
from tests.chaos.timed import timed_fault
from waltz.v1 import server_pb2, server_pb2_grpc
from waltz_common import tls
from waltz_common.testing.fault_proxy import FaultProxy
from waltz_common.testing.local_cluster import LocalCluster
from waltz_common.testing.zookeeper import ZooKeeperProcess

HOLD_S = 6.0  # how long a fault that stops appends is held
KEEPALIVE = {"storage.keepaliveTime": 1000}
SESSION_TIMEOUT_S = 4.0  # tests/chaos/cluster.SERVER_OVERRIDES["zookeeper.sessionTimeoutSeconds"]


def proxies(cluster: LocalCluster, count: int) -> list[FaultProxy]:
    found = [node.proxy for node in cluster.storage[len(cluster.storage) - count :]]
    assert all(p is not None for p in found), "the cluster is not proxied"
    return [p for p in found if p is not None]


def each(links: list[FaultProxy], action: str) -> None:
    for link in links:
        getattr(link, action)()


@pytest.mark.parametrize("mode", ["cut", "blackhole"])
def test_a_server_partitioned_from_one_two_and_all_storage_nodes(
    mode: str, zookeeper: ZooKeeperProcess, cluster_root: str, tmp_path: Path
) -> None:
    """One node gone: STEP appends on the other two while it is (a blackholed node is dropped after
    storage.replicaLagTimeout, 5 s). Two or three gone: no quorum, so at most the appends in flight at the fault
    are acknowledged (none of them on a minority: the history check finds any), and appends go on once healed."""

    async def scenario(cluster: LocalCluster) -> None:
        await healthy_owners(cluster)
        async with writing(cluster) as writer:
            acked = await writer.acknowledged_at_least(STEP, "before the partitions")
            in_flight = PARTITIONS * writer.client.config.max_concurrent_transactions
            for count in (1, 2, 3):
                links = proxies(cluster, count)
                name = f"{mode} from {count} storage node{'s' if count > 1 else ''}"

                start = writer.acknowledged
                hold = partial(writer.acknowledged_at_least, start + STEP, name, 30) if count == 1 else HOLD_S
                found, during = await timed_fault(
                    writer,
                    name,
                    partial(each, links, mode),
                    partial(each, links, "heal"),
                    hold,
                    STEP,
                    settle=partial(healthy_owners, cluster),
                    partitions=PARTITIONS,
                )
                report(name, f"{found.describe()}; {during} acknowledged during the fault")
                if count > 1:
                    assert during <= in_flight, f"{during} acknowledged without a quorum ({in_flight} were in flight)"
                acked = writer.acknowledged
        report(f"partitions ({mode})", f"{acked} acknowledged")
        await check_run(cluster, writer, f"storage partitions ({mode})")

    on_cluster(zookeeper, cluster_root, tmp_path, scenario, servers=1, proxied=True)


@pytest.mark.parametrize("mode", ["cut", "blackhole"])
def test_a_client_partitioned_from_one_of_its_servers(
    mode: str, zookeeper: ZooKeeperProcess, cluster_root: str, tmp_path: Path
) -> None:
    """The client reaches the two servers through their proxies (server.advertisedAddress); the link to the one
    that owns partition 0 is cut or blackholed for HOLD_S, then healed: the client's appends to that server's
    partitions wait (the writer, round-robin, waits with them once their slots are full) and go on once healed."""

    async def scenario(cluster: LocalCluster) -> None:
        await healthy_owners(cluster)
        victim_id = (await asyncio.to_thread(assignment, cluster))[0].server_id
        victim = (await servers_by_id(cluster))[victim_id]
        link = victim.proxy
        assert link is not None
        async with writing(cluster) as writer:
            await writer.acknowledged_at_least(STEP, "before the partition")
            name = f"client link {mode}"
            found, during = await timed_fault(
                writer, name, getattr(link, mode), link.heal, HOLD_S, STEP, partitions=PARTITIONS
            )
            report(name, f"{victim.name} (server {victim_id}): {found.describe()}; {during} acknowledged meanwhile")
        await check_run(cluster, writer, name)

    on_cluster(zookeeper, cluster_root, tmp_path, scenario, proxied=True)


def test_a_slow_replica_does_not_slow_appends(zookeeper: ZooKeeperProcess, cluster_root: str, tmp_path: Path) -> None:
    """100 ms on every message to and from one storage node: a quorum is the other two, so appends go on and the
    slow replica stays in the write set (it never lags a quorum by storage.replicaLagTimeout); once healed it holds
    what the others do. The rates are reported, not asserted (tests/chaos/test_slow_replica.py counts what waited
    for a far replica under a heavier load)."""

    async def scenario(cluster: LocalCluster) -> None:
        await healthy_owners(cluster)
        (link,) = proxies(cluster, 1)
        async with writing(cluster) as writer:
            await writer.acknowledged_at_least(STEP, "warm up")
            rates = []
            for phase, delay_s in (("before", 0.0), ("slow", 0.1), ("healed", 0.0)):
                if delay_s:
                    link.delay(delay_s)
                    before = await sessions(cluster)
                else:
                    link.heal()
                start, began = writer.acknowledged, time.monotonic()
                await writer.acknowledged_at_least(start + 2 * STEP, f"{phase} ({delay_s * 1000:g} ms on one link)", 60)
                rates.append(f"{phase} {(writer.acknowledged - start) / (time.monotonic() - began):.0f}/s")
                if delay_s:
                    during = await sessions(cluster)
            kept = all(during[p][:2] == before[p][:2] for p in before)  # no new session: still in the write set
            report(
                "slow replica",
                f"appends acknowledged {', '.join(rates)}; store sessions {'kept' if kept else 'ended'} "
                f"(generation, session, hwm) {before} -> {during}",
            )
            assert kept, "the slow replica's sessions ended: it was dropped from the write set"
        await check_run(cluster, writer, "slow replica")

    on_cluster(zookeeper, cluster_root, tmp_path, scenario, servers=1, proxied=True)


def test_a_server_cut_off_from_zookeeper_past_its_session_timeout(
    zookeeper: ZooKeeperProcess, cluster_root: str, tmp_path: Path
) -> None:
    """The ZooKeeper link of the server owning partition 0 blackholed for twice the session timeout while two
    clients keep writing: ZooKeeper expires its session, its partitions move to the other server at higher
    generations; healed, it finds its session gone, registers again and takes partitions back. Cut off, it goes
    on serving its partitions (issue 32) until fenced: once the new owner's store sessions are open (its recovery
    fenced the old ones at a majority), the cut-off server commits nothing more on them."""

    async def scenario(cluster: LocalCluster) -> None:
        await healthy_owners(cluster)
        before = await asyncio.to_thread(assignment, cluster)
        victim_id = before[0].server_id
        victim = (await servers_by_id(cluster))[victim_id]
        link = victim.zookeeper_proxy
        assert link is not None
        moved = sorted(pid for pid, o in before.items() if o.server_id == victim_id)
        heir = next(s for sid, s in (await servers_by_id(cluster)).items() if sid != victim_id)
        victim_marks: list[dict[int, int]] = []  # the victim's high-water marks of the moved partitions

        async def victims_high_water_marks() -> dict[int, int]:
            answer = await server_partitions(cluster, victim.address)
            return {p.partition_id: p.high_water_mark for p in answer.partitions if p.partition_id in moved}

        async def taken_over() -> bool:
            answer = await server_partitions(cluster, heir.address)
            return all(any(p.partition_id == pid and p.healthy for p in answer.partitions) for pid in moved)

        async with writing_from(cluster, clients=2, submitters=2, limit=10**9) as load:  # bounded by the steps
            await load.acknowledged_at_least(STEP, "before the partition")

            async def expired() -> None:
                await asyncio.sleep(2 * SESSION_TIMEOUT_S)
                await until(
                    lambda: all(assignment(cluster)[pid].server_id != victim_id for pid in moved),
                    f"partitions {moved} moved off server {victim_id}",
                    30,
                )
                deadline = time.monotonic() + 30
                while not await taken_over():  # the new owner's sessions are open: the victim's are fenced
                    assert time.monotonic() < deadline, f"server {heir.address} did not open {moved}"
                    await asyncio.sleep(0.1)
                victim_marks.append(await victims_high_water_marks())
                await asyncio.sleep(2.0)  # still cut off from ZooKeeper
                victim_marks.append(await victims_high_water_marks())

            name = "zookeeper link blackhole"
            found, during = await timed_fault(
                load,
                name,
                link.blackhole,
                link.heal,
                expired,
                STEP,
                settle=lambda: healthy_owners(cluster),
                partitions=PARTITIONS,
            )
            after = await asyncio.to_thread(assignment, cluster)
            generations = [{p: (o.server_id, o.generation) for p, o in sorted(a.items())} for a in (before, after)]
            report(
                name,
                f"server {victim_id} (owner of {moved}) cut off {2 * SESSION_TIMEOUT_S:g} s: {found.describe()}; "
                f"{during} acknowledged meanwhile; (server, generation) {generations[0]} -> {generations[1]}",
            )
            for pid in moved:
                assert after[pid].generation > before[pid].generation, (pid, before, after)
            fenced, later = victim_marks
            report(name, f"server {victim_id}'s high-water marks of {moved} once fenced {fenced}, 2 s later {later} "
                         "(a partition missing: closed, fenced)")
            assert all(later.get(pid, mark) == mark for pid, mark in fenced.items()), victim_marks
        await check_run(cluster, load.writers, name)

    on_cluster(zookeeper, cluster_root, tmp_path, scenario, proxied=True)


async def storage_links(cluster: LocalCluster) -> dict[str, bool]:
    """The first server's connections to the storage nodes as it reports them: connect string -> connected."""
    async with tls.aio_channel(cluster.servers[0].address, cluster.tls_files("operator")) as channel:
        stub = server_pb2_grpc.WaltzServerStub(channel)
        answer = await stub.CheckStorageConnectivity(server_pb2.StorageConnectivityRequest(), timeout=10)
    return {n.connect_string: n.connected for n in answer.nodes}


def test_a_server_notices_an_idle_storage_link_that_went_dead(zookeeper: ZooKeeperProcess, cluster_root: str,
                                                              tmp_path: Path) -> None:
    """A storage node's host gone without a reset (power lost, a partition) while no append is in flight: the
    server's keepalive pings go unanswered and it gives the connection up within about twice
    storage.keepaliveTime (before, an idle link stayed 'connected' until the next request timed out), then
    reconnects once the link is back."""

    async def scenario(cluster: LocalCluster) -> None:
        await healthy_owners(cluster)
        [link] = proxies(cluster, 1)
        node = cluster.storage[-1].connect_string
        assert (await storage_links(cluster))[node]
        link.blackhole()
        dead = time.monotonic()
        links: dict[str, bool] = {}
        while time.monotonic() - dead < 10:
            links = await storage_links(cluster)
            if not links[node]:
                break
            await asyncio.sleep(0.2)
        noticed = time.monotonic() - dead
        report("idle storage link blackholed", f"given up {noticed:.1f} s after the link went dead")
        assert not links[node], f"still connected after {noticed:.1f} s: {links}"
        link.heal()
        deadline = time.monotonic() + 30
        while not (await storage_links(cluster))[node]:
            assert time.monotonic() < deadline, "not connected again within 30 s of the heal"
            await asyncio.sleep(0.2)

    on_cluster(zookeeper, cluster_root, tmp_path, scenario, servers=1, proxied=True, **KEEPALIVE)
