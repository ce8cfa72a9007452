"""The CLI drives a real local cluster: create, add nodes, assign, start, verify, validate, kill, replace a node."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator

import pytest

from tests.unit.cli.helpers import Run, waltz
from waltz_common.testing.local_cluster import LocalCluster


def until(check: Callable[[], Run], timeout: float = 90.0) -> Run:
    """Run check until it exits 0 (returns that run) or the timeout passes (returns the last run)."""
    deadline = time.monotonic() + timeout
    while True:
        run = check()
        if run.code == 0 or time.monotonic() > deadline:
            return run
        time.sleep(1.0)


@pytest.fixture
def unstarted(zookeeper, cluster_root, tmp_path) -> Iterator[LocalCluster]:
    """A LocalCluster whose processes the test starts itself, after the CLI has set the cluster up."""
    cluster = LocalCluster(
        tmp_path,
        storage_nodes=3,
        servers=1,
        partitions=2,
        zookeeper=zookeeper.connect_string,
        cluster_root=cluster_root,
    )
    try:
        yield cluster
    finally:
        cluster.stop()


def test_cli_sets_up_verifies_validates_and_replaces_a_dead_node(unstarted, capsys):
    cluster = unstarted

    def cli(*argv: str) -> Run:
        return waltz(capsys, "--zookeeper", cluster.zookeeper, "--root", cluster.paths.root, "--timeout", "10", *argv)

    # Set up with the CLI only: create, add nodes, assign, start the nodes, create their partitions, start a server.
    assert cli("cluster", "create", "-n", "local", "-p", "2").code == 0
    for index in range(3):
        node = cluster._storage_node(index)  # the helper's config writer; the CLI registers the node
        cluster.storage.append(node)
        added = cli("storage", "add-node", "-s", node.connect_string, "-a", str(node.admin_port), "-g", str(index))
        assert added.code == 0, added.err
        assert cli("storage", "assign", "-s", node.connect_string, "-p", "0-1").code == 0
        node.start()
    synced = cli("storage", "sync", "--json")
    assert synced.code == 0, synced.err
    assert all(report["added"] == [0, 1] for report in synced.json().values())
    cluster.add_server()

    verified = until(lambda: cli("cluster", "verify"))
    assert verified.code == 0, verified.out
    assert verified.out.rstrip().endswith("PASSED")
    assert cli("cluster", "check-connectivity").code == 0

    validated = cli("client", "validate", "-p", "1", "-n", "15", "--producers", "2", "--consumers", "2", "--json")
    assert validated.code == 0, validated.out + validated.err
    result = validated.json()
    assert result["passed"] and result["committed"] == 30 and result["consumed"] == {"0": 30, "1": 30}
    hwm = cli("client", "high-water-mark", "--json").json()
    assert hwm["1"] == result["start_high_water_mark"] + 30
    tail = cli("client", "tail", "-p", "1", "-n", "3", "--json")
    assert [json.loads(line)["transaction_id"] for line in tail.out.splitlines()] == [hwm["1"] - i for i in (2, 1, 0)]

    # Kill a storage node: verify fails and names it.
    dead = cluster.storage[1]
    dead.kill()
    failed = cli("cluster", "verify")
    assert failed.code == 1 and failed.out.rstrip().endswith("FAILED")
    assert f"storage node {dead.connect_string}: nothing listens on its admin port" in failed.out

    # The dead node's files, read offline: intact, and every record holds its own id (the validate invariant).
    checked = cli("disk", "verify-segment", str(dead.directory), "--json")
    assert checked.code == 0, checked.out
    segment = dead.directory / "1" / f"{0:019d}.seg"
    records = cli("disk", "dump-segment", str(segment), "--data", "--json").json()["records"]
    assert records and all(r["data"] == str(r["transaction_id"]) for r in records)

    # Replace it: a new node copies both partitions from a healthy replica and joins; the dead one leaves.
    new = cluster._storage_node(3)
    cluster.storage.append(new)
    new.start()
    assert cli("storage", "add-node", "-s", new.connect_string, "-a", str(new.admin_port), "-g", "3").code == 0
    source = cluster.storage[0].connect_string
    recovered = cli("storage", "recover-partition", "-s", source, "-d", new.connect_string, "-p", "0-1", "--json")
    assert recovered.code == 0, recovered.err
    copied = {p["partition"]: p for p in recovered.json()["partitions"]}
    assert copied[1]["end"] == hwm["1"]
    assert cli("storage", "unassign", "-s", dead.connect_string, "-p", "0-1").code == 0
    assert cli("storage", "remove-node", "-s", dead.connect_string).code == 0
    healed = until(lambda: cli("cluster", "verify"))
    assert healed.code == 0, healed.out
    after = cli("client", "validate", "-p", "1", "-n", "5", "--producers", "2", "--json")
    assert after.code == 0 and after.json()["passed"], after.out + after.err
    expected = hwm["1"] + 10
    for _ in range(30):  # the new replica may trail the quorum by a batch
        stored = cli("storage", "max-transaction-id", "-s", new.connect_string, "-p", "1", "--json").json()["1"]
        if stored == expected:
            break
        time.sleep(0.5)
    assert stored == expected
