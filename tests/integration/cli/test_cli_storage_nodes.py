"""`waltz storage`, `verify`, `recover-partition` and `waltz disk` against real storage node processes (no server)."""

from __future__ import annotations

import pytest

from tests.unit.cli.helpers import waltz
from waltz.v1 import metadata_pb2
from waltz_cli.storage_session import StorageSession
from waltz_common import cluster_admin
from waltz_common import zk as zkmeta
from waltz_common.testing.local_cluster import LocalCluster
from waltz_common.types import Record, ReqId, crc32
from waltz_storage.admin_client import StorageAdminClient


@pytest.fixture
def nodes(make_cluster) -> LocalCluster:
    """Three storage node processes holding partitions 0 and 1 each; no server."""
    return make_cluster(storage_nodes=3, servers=0, partitions=2)


@pytest.fixture
def cli(nodes, capsys):
    def run(*argv: str):
        return waltz(capsys, "--zookeeper", nodes.zookeeper, "--root", nodes.paths.root, "--timeout", "5", *argv)

    return run


def _records(pid: int, first: int, last: int, tag: str = "") -> list[Record]:
    out = []
    for txn in range(first, last + 1):
        data = f"{tag}txn-{txn}".encode()
        out.append(Record(txn, ReqId(1, 0, pid, txn), 0, data, crc32(data)))
    return out


def _write(cluster: LocalCluster, node: int, pid: int, session: int, records: list[Record], lwm: int | None) -> None:
    """Append online in a store session, as a server would, then optionally start the next session at lwm."""
    target = cluster.storage[node].connect_string
    with StorageSession(target, cluster.cluster_key, cluster.num_partitions, 10, offline=False) as s:
        if records:
            s.append(pid, session, records)
        if lwm is not None:
            s.set_low_water_mark(pid, session + 1, lwm)


def _stored(cluster: LocalCluster, node: int, pid: int) -> list[tuple[int, bytes]]:
    storage = cluster.storage[node]
    with StorageAdminClient("127.0.0.1", storage.admin_port, cluster.cluster_key, cluster.num_partitions) as admin:
        return [(r.transaction_id, r.data) for r in admin.record_list(pid, 0, 10_000)]


def test_node_commands(nodes, cli, zk):
    a = nodes.storage[0].connect_string
    _write(nodes, 0, 1, 1, _records(1, 0, 9), lwm=None)
    listed = cli("storage", "list", "-s", a, "--json")
    assert listed.code == 0, listed.err
    assert [(p["partition"], p["max_transaction_id"]) for p in listed.json()["partitions"]] == [(0, -1), (1, 9)]
    assert cli("storage", "max-transaction-id", "-s", a, "-p", "1", "--json").json() == {"1": 9}
    off = cli("storage", "availability", "-s", a, "-p", "0-1", "--writable", "false")
    assert off.code == 0, off.err
    assert [p["writable"] for p in cli("storage", "list", "-s", a, "--json").json()["partitions"]] == [False, False]
    assert "partition 0 is unwritable" in cli("cluster", "verify").out
    assert cli("storage", "availability", "-s", a, "-p", "0-1", "-o", "true").code == 0
    unconfirmed = cli("storage", "remove-partition", "-s", a, "-p", "0")
    assert unconfirmed.code == 2 and "--delete-storage-files" in unconfirmed.err
    listed = cli("storage", "remove-partition", "-s", a, "-p", "0", "-d")
    assert listed.code == 1 and f"ZooKeeper still assigns partition 0 to {a}: unassign it first" in listed.err
    forced = cli("storage", "remove-partition", "-s", a, "-p", "0", "-d", "--force")
    assert forced.code == 0 and "risk: a replica a store session counts on loses its files" in forced.out
    assert f"storage node {a} does not hold partition 0" in cli("cluster", "verify").out
    synced = cli("storage", "sync", "--json")
    assert synced.code == 0 and synced.json()[a]["added"] == [0]
    assert [p["partition"] for p in cli("storage", "list", "-s", a, "--json").json()["partitions"]] == [0, 1]
    # Partition 1 on a holds 0..9, nobody else anything: sync --remove-extra keeps it unless forced.
    cluster_admin.unassign_partitions(zk, nodes.paths, a, [1])
    only = cli("storage", "sync", "--remove-extra")
    assert only.code == 1, only.out
    assert f"{a} holds partition 1 up to transaction 9 but the other assigned replicas hold nothing" in only.err
    assert cli("storage", "max-transaction-id", "-s", a, "-p", "1", "--json").json() == {"1": 9}
    gone = cli("storage", "sync", "--remove-extra", "--force", "--json")
    assert gone.code == 0 and gone.json()[a]["removed"] == [1] and "transactions 0..9" in gone.json()["forced"][0]
    unknown = cli("storage", "list", "-s", "127.0.0.1:1")
    assert unknown.code == 2 and "not in the cluster" in unknown.err


def test_verify_names_a_killed_storage_node(nodes, cli):
    verified = cli("cluster", "verify")
    assert "[PASS] storage nodes hold what ZooKeeper assigns them" in verified.out, verified.out
    dead = nodes.storage[1]
    dead.kill()
    run = cli("cluster", "verify")
    assert run.code == 1 and run.out.rstrip().endswith("FAILED")
    assert (
        f"storage node {dead.connect_string}: nothing listens on its admin port 127.0.0.1:{dead.admin_port}" in run.out
    )
    assert "has no quorum" not in run.out
    nodes.storage[2].kill()
    assert "partition 0 has no quorum: 1 of 3 replicas usable" in cli("cluster", "verify").out
    down = cli("storage", "list", "-s", dead.connect_string)
    assert down.code == 1 and len(down.err.strip().splitlines()) == 1 and "is the node running?" in down.err


def test_recover_a_new_and_a_dirty_replica(nodes, cli, zk):
    src, new, dirty = (n.connect_string for n in nodes.storage)
    # The source held 0..79 in session 1; session 2 started at high-water mark 69, so 0..69 are known committed.
    _write(nodes, 0, 0, 1, _records(0, 0, 79), lwm=None)
    with StorageSession(src, nodes.cluster_key, 2, 10, offline=False) as s:
        s.truncate(0, 2, 69)
        s.set_low_water_mark(0, 2, 69)
    _write(nodes, 0, 0, 2, _records(0, 70, 79), lwm=None)
    # A new replica: nothing on node 1 for partition 0, not in ZooKeeper's assignment.
    cluster_admin.unassign_partitions(zk, nodes.paths, new, [0])
    assert cli("storage", "remove-partition", "-s", new, "-p", "0", "-d").code == 0
    run = cli("storage", "recover-partition", "-s", src, "-d", new, "-p", "0", "-b", "16", "--json")
    assert run.code == 0, run.err
    (done,) = run.json()["partitions"]
    assert (done["start"], done["end"], done["copied"], done["low_water_mark"]) == (0, 69, 70, 69)
    assert _stored(nodes, 1, 0) == _stored(nodes, 0, 0)[:70]
    assert 0 in cluster_admin.replica_assignments(zk, nodes.paths)[new]
    state = {p["partition"]: p for p in cli("storage", "list", "-s", new, "--json").json()["partitions"]}[0]
    assert (state["writable"], state["low_water_mark"], state["local_low_water_mark"]) == (True, 69, 69)
    # A dirty replica: clean up to 40 (its local low-water mark), then a divergent tail up to 75.
    _write(nodes, 2, 0, 1, _records(0, 0, 40), lwm=40)
    _write(nodes, 2, 0, 2, _records(0, 41, 75, tag="dirty-"), lwm=None)
    run = cli("storage", "recover-partition", "-s", src, "-d", dirty, "-p", "0", "--json")
    assert run.code == 0, run.err
    (done,) = run.json()["partitions"]
    assert (done["start"], done["end"], done["copied"]) == (41, 69, 29)
    assert _stored(nodes, 2, 0) == _stored(nodes, 0, 0)[:70]


def test_recover_refuses_a_source_behind_the_destination(nodes, cli):
    src, dst = nodes.storage[0].connect_string, nodes.storage[1].connect_string
    _write(nodes, 1, 0, 1, _records(0, 0, 20), lwm=20)
    run = cli("storage", "recover-partition", "-s", src, "-d", dst, "-p", "0")
    assert run.code == 1 and "choose a more advanced source" in run.err
    assert f"partition 0 on {dst} is left unwritable" in run.err and len(run.err.strip().splitlines()) == 1
    state = cli("storage", "list", "-s", dst, "--json").json()["partitions"][0]
    assert (state["writable"], state["max_transaction_id"]) == (False, 20)
    same = cli("storage", "recover-partition", "-s", src, "-d", src, "-p", "0")
    assert same.code == 2 and "same node" in same.err


def _members(zk, cluster: LocalCluster, pid: int, session: int, states: dict[str, tuple[int, int]]) -> None:
    """Write the partition metadata a server would: the current session and the replicas' states."""
    metadata = metadata_pb2.PartitionMetadata(generation=1, session_id=session)
    for node, (sid, closing) in states.items():
        rid = metadata_pb2.ReplicaId(partition_id=pid, storage_node_connect_string=node)
        state = metadata_pb2.ReplicaState(replica_id=rid, session_id=sid, closing_high_water_mark=closing)
        metadata.replica_states.add(replica_id=rid, replica_state=state)
    zkmeta.write(zk, cluster.paths.partition_metadata(pid), metadata)


def test_recover_refuses_a_destination_in_the_current_session(nodes, cli, zk):
    """The issue's scenario: idle partition, write set {A, C} acknowledged up to 1000, B lagging at 500.
    Before the guard, `-s B -d C` truncated C to its local low-water mark 400 and copied B's 401..500, so the
    next session resolved at 500 from B's and C's votes and truncated A from 501."""
    a, b, c = (n.connect_string for n in nodes.storage)
    for node, last in ((0, 1000), (1, 500), (2, 1000)):
        _write(nodes, node, 0, 1, _records(0, 0, 400), lwm=400)
        _write(nodes, node, 0, 2, _records(0, 401, last), lwm=None)
    _members(zk, nodes, 0, 2, {a: (2, zkmeta.UNRESOLVED), b: (2, zkmeta.UNRESOLVED), c: (2, zkmeta.UNRESOLVED)})
    before = _stored(nodes, 2, 0)
    run = cli("storage", "recover-partition", "-s", b, "-d", c, "-p", "0")
    assert run.code == 1 and f"{c} is a member of partition 0's store session 2" in run.err, run.err
    assert _stored(nodes, 2, 0) == before and before[-1][0] == 1000
    assert cli("storage", "list", "-s", c, "--json").json()["partitions"][0]["writable"]


def test_disk_commands_on_files_of_a_real_storage_node(nodes, cli, capsys):
    _write(nodes, 0, 1, 4, _records(1, 0, 24), lwm=24)
    node = nodes.storage[0]
    node.stop()
    directory = str(node.directory)
    control = waltz(capsys, "disk", "dump-control", directory, "--json").json()
    assert control["cluster_key"] == nodes.cluster_key and control["num_partitions"] == 2
    p1 = control["partitions"][1]
    assert p1["assigned"] and p1["slots"][p1["current_slot"]]["session_id"] == 5
    assert p1["slots"][p1["current_slot"]]["low_water_mark"] == 24
    verified = waltz(capsys, "disk", "verify-segment", directory, "--json")
    assert verified.code == 0, verified.out
    assert sorted(s["records"] for s in verified.json()["segments"]) == [0, 25]
    segment = str(node.directory / "1" / f"{0:019d}.seg")
    dumped = waltz(capsys, "disk", "dump-segment", segment, "--data", "--json").json()
    assert [(r["transaction_id"], r["data"]) for r in dumped["records"]] == [(t, f"txn-{t}") for t in range(25)]
    assert dumped["header"]["cluster_key"] == nodes.cluster_key
