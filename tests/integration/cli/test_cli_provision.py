"""`waltz cluster provision` against a real ZooKeeper and storage node processes: install, re-run, scale out."""

from __future__ import annotations

import pytest

from tests.unit.cli.helpers import waltz
from waltz_cli import storage
from waltz_common import cluster_admin
from waltz_common import zk as zkmeta
from waltz_common.testing.local_cluster import BIN, StorageNode, free_port


def _storage_node(tmp_path, zookeeper, root: str, index: int) -> StorageNode:
    port, admin = free_port(), free_port()
    config = tmp_path / f"storage{index}.yaml"
    config.write_text(
        f"zookeeper.connectString: {zookeeper}\ncluster.root: {root}\nstorage.host: 127.0.0.1\n"
        f"storage.port: {port}\nstorage.admin.port: {admin}\nstorage.directory: {tmp_path / f'data{index}'}\n"
    )
    return StorageNode(
        f"storage{index}", [str(BIN / "waltz-storage")], config, tmp_path / f"storage{index}.log",
        "waltz-storage ready", port=port, admin_port=admin,
    )


@pytest.fixture
def nodes(tmp_path, zookeeper, cluster_root):
    made = [_storage_node(tmp_path, zookeeper.connect_string, cluster_root, i) for i in range(4)]
    yield made
    for node in made:
        node.stop()


def test_provision_install_rerun_and_scale_out(zookeeper, zk, cluster_root, nodes, capsys, monkeypatch):
    paths = zkmeta.ZkPaths(cluster_root)
    listed_at_sync: dict[str, dict[str, list[int]]] = {}
    sync_node = storage.sync_node

    def recording_sync(ctx, node, want, *args, **kwargs):
        listed_at_sync[node] = cluster_admin.replica_assignments(zk, paths)  # what servers could see then
        return sync_node(ctx, node, want, *args, **kwargs)

    monkeypatch.setattr(storage, "sync_node", recording_sync)

    def provision(count: int, *extra: str):
        node_args = [a for n in nodes[:count] for a in ("--node", f"{n.connect_string}:{n.admin_port}")]
        return waltz(
            capsys, "--zookeeper", zookeeper.connect_string, "--root", cluster_root, "--timeout", "5", "--json",
            "cluster", "provision", "-n", "test", "-p", "3", "-r", "3", *node_args, *extra,
        )

    # Storage nodes refuse to start before the cluster exists, and a sync needs them up: exit 1, retried.
    first = provision(3)
    assert first.code == 1, first.out
    assert "unreachable" in first.err or "not listening" in first.err or "storage node" in first.err
    # nothing assigned yet: the nodes could not be given the partitions first
    assert cluster_admin.replica_assignments(zk, paths) == {}
    for node in nodes[:3]:
        node.start()
    again = provision(3)
    assert again.code == 0, again.err
    assert again.json()["assigned"] == {n.connect_string: [0, 1, 2] for n in nodes[:3]}
    assert cluster_admin.replica_assignments(zk, paths) == {n.connect_string: [0, 1, 2] for n in nodes[:3]}
    # each node had its partitions before ZooKeeper listed any replica
    assert listed_at_sync == {n.connect_string: {} for n in nodes[:3]}
    assert again.json()["created"] is False
    assert again.json()["created_partitions"] == {n.connect_string: [0, 1, 2] for n in nodes[:3]}

    settled = provision(3)
    assert settled.code == 0, settled.err
    assert settled.json()["added_nodes"] == [] and settled.json()["assigned"] == {}
    assert settled.json()["created_partitions"] == {n.connect_string: [] for n in nodes[:3]}

    nodes[3].start()
    scaled = provision(4)
    assert scaled.code == 0, scaled.err
    assert scaled.json()["added_nodes"] == [nodes[3].connect_string]
    assert scaled.json()["idle_nodes"] == [nodes[3].connect_string]
    assert cluster_admin.storage_nodes(zk, paths)[nodes[3].connect_string] == (3, nodes[3].admin_port)
    assert cluster_admin.replica_assignments(zk, paths) == {n.connect_string: [0, 1, 2] for n in nodes[:3]}

    wrong = provision(4, "-p", "5")
    assert wrong.code == 2 and "3 partitions, not 5" in wrong.err
