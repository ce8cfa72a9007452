"""The operator tools refuse what would lose acknowledged transactions, on a running cluster (issue 17)."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from tests.unit.cli.helpers import Run, waltz
from waltz.v1 import metadata_pb2
from waltz_common import cluster_admin
from waltz_common import zk as zkmeta
from waltz_common.testing.local_cluster import LocalCluster


@pytest.fixture
def cluster(make_cluster) -> LocalCluster:
    return make_cluster(storage_nodes=3, servers=1, partitions=1)


@pytest.fixture
def cli(cluster, capsys) -> Callable[..., Run]:
    def run(*argv: str) -> Run:
        return waltz(capsys, "--zookeeper", cluster.zookeeper, "--root", cluster.paths.root, "--timeout", "10", *argv)

    return run


def _states(zk, cluster: LocalCluster) -> tuple[int, dict[str, tuple[int, int]]]:
    metadata = zkmeta.require(zk, cluster.paths.partition_metadata(0), metadata_pb2.PartitionMetadata)[0]
    states = {
        e.replica_id.storage_node_connect_string: (e.replica_state.session_id, e.replica_state.closing_high_water_mark)
        for e in metadata.replica_states
    }
    return metadata.session_id, states


def _wait_states(zk, cluster: LocalCluster, members: set[str], timeout: float = 60.0) -> dict[str, tuple[int, int]]:
    """Until exactly members are listed, each a clean member (unresolved closing mark) of the current session."""
    deadline = time.monotonic() + timeout
    while True:
        session, states = _states(zk, cluster)
        clean = {r for r, (s, closing) in states.items() if s == session and closing == zkmeta.UNRESOLVED}
        if set(states) == members and clean == members:
            return states
        assert time.monotonic() < deadline, f"replica states {states} in session {session}, wanted {members}"
        time.sleep(0.2)


def _append(cli: Callable[..., Run], count: int) -> None:
    run = cli("client", "validate", "-p", "0", "-n", str(count), "--producers", "1", "--consumers", "1", "--json")
    assert run.code == 0 and run.json()["passed"], run.out + run.err


def _max_txn(cli: Callable[..., Run], node: str) -> int:
    return cli("storage", "max-transaction-id", "-s", node, "-p", "0", "--json").json()["0"]


def test_recover_partition_refuses_a_member_of_the_current_session(cluster, cli, zk):
    a, b, c = (n.connect_string for n in cluster.storage)
    _wait_states(zk, cluster, {a, b, c})
    _append(cli, 30)
    assert cli("storage", "availability", "-s", b, "-p", "0", "--writable", "false").code == 0  # B lags from here on
    _append(cli, 30)
    acknowledged = cli("client", "high-water-mark", "--json").json()["0"]
    assert _max_txn(cli, c) == acknowledged and _max_txn(cli, b) < acknowledged
    _, states = _states(zk, cluster)
    assert states[a][1] == states[c][1] == zkmeta.UNRESOLVED  # A and C vote in the next recovery

    # Before the guard this truncated C to its local low-water mark and copied B's shorter log onto it.
    run = cli("storage", "recover-partition", "-s", b, "-d", c, "-p", "0")
    assert run.code == 1
    assert f"{c} is a member of partition 0's store session" in run.err
    assert f"unassign it first (waltz storage unassign -s {c} -p 0)" in run.err
    assert _max_txn(cli, c) == acknowledged
    assert [p["writable"] for p in cli("storage", "list", "-s", c, "--json").json()["partitions"]] == [True]
    assert cli("client", "high-water-mark", "--json").json()["0"] == acknowledged


def test_unassign_keeps_a_majority_and_deletion_keeps_listed_replicas(cluster, cli, zk):
    a, b, c = (n.connect_string for n in cluster.storage)
    _wait_states(zk, cluster, {a, b, c})
    _append(cli, 20)

    server = cluster.servers[0]
    server.stop()  # no new store session until it is back: C stays listed as a member
    assert cli("storage", "unassign", "-s", c, "-p", "0").code == 0  # A and B remain: 2 of 3
    member = cli("storage", "remove-partition", "-s", c, "-p", "0", "-d")
    assert member.code == 1 and "still a member of partition 0's store session" in member.err, member.err
    server.start()
    _wait_states(zk, cluster, {a, b})  # the next store session runs without C
    removed = cli("storage", "remove-partition", "-s", c, "-p", "0", "-d")
    assert removed.code == 0, removed.err  # A and B hold everything C held

    previous = ", ".join(sorted([a, b]))
    refused = cli("storage", "unassign", "-s", b, "-p", "0")
    assert refused.code == 1
    assert f"partition 0 would keep 1 of its previous replica set {{{previous}}} without {b}" in refused.err
    assert "--force does it anyway" in refused.err
    assert b in cluster_admin.replica_assignments(zk, cluster.paths)
    assigned = cli("storage", "remove-partition", "-s", b, "-p", "0", "-d")
    assert assigned.code == 1 and f"ZooKeeper still assigns partition 0 to {b}: unassign it first" in assigned.err
    _append(cli, 5)  # the partition still works

    forced = cli("storage", "unassign", "-s", b, "-p", "0", "--force")
    assert forced.code == 0, forced.err
    assert "forced: partition 0 would keep 1" in forced.out and "cannot resolve its high-water mark" in forced.out
