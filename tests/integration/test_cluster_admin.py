"""Cluster metadata administration against the real ZooKeeper."""

from __future__ import annotations

import pytest

from waltz.v1 import metadata_pb2
from waltz_common import cluster_admin as admin
from waltz_common import zk as zkmeta


def test_create_add_assign_and_delete(zk, cluster_root):
    paths = zkmeta.ZkPaths(cluster_root)
    key = admin.create_cluster(zk, paths, "test", 4)
    assert zkmeta.store_params(zk, paths).cluster_key == key
    for pid in range(4):
        meta = zkmeta.require(zk, paths.partition_metadata(pid), metadata_pb2.PartitionMetadata)[0]
        assert (meta.generation, meta.session_id) == (0, -1)
    with pytest.raises(zkmeta.MetadataError, match="already exists"):
        admin.create_cluster(zk, paths, "test", 4)
    for n in range(3):
        admin.add_storage_node(zk, paths, f"127.0.0.1:{5000 + n}", 6000 + n, group=n)
    assert admin.storage_nodes(zk, paths)["127.0.0.1:5001"] == (1, 6001)
    with pytest.raises(zkmeta.MetadataError, match="already in the cluster"):
        admin.add_storage_node(zk, paths, "127.0.0.1:5000", 6000)
    for n in range(3):
        assert admin.auto_assign(zk, paths, group=n) == {f"127.0.0.1:{5000 + n}": [0, 1, 2, 3]}
    with pytest.raises(zkmeta.MetadataError, match="already has assignments"):
        admin.auto_assign(zk, paths, group=0)
    admin.unassign_partitions(zk, paths, "127.0.0.1:5000", [1, 2])
    assert admin.replica_assignments(zk, paths)["127.0.0.1:5000"] == [0, 3]
    with pytest.raises(zkmeta.MetadataError, match="still holds partitions"):
        admin.remove_storage_node(zk, paths, "127.0.0.1:5000")
    with pytest.raises(zkmeta.MetadataError, match="do not exist"):
        admin.assign_partitions(zk, paths, "127.0.0.1:5000", [9])
    admin.delete_cluster(zk, paths)
    assert zk.exists(cluster_root) is None


def test_last_replica_cannot_be_unassigned(zk, cluster_root):
    paths = zkmeta.ZkPaths(cluster_root)
    admin.create_cluster(zk, paths, "test", 2)
    admin.add_storage_node(zk, paths, "127.0.0.1:5000", 6000)
    admin.assign_partitions(zk, paths, "127.0.0.1:5000", [0, 1])
    with pytest.raises(zkmeta.MetadataError, match="no replica left"):
        admin.unassign_partitions(zk, paths, "127.0.0.1:5000", [1])


@pytest.mark.parametrize(("text", "expected"), [("0-3,5", [0, 1, 2, 3, 5]), ("7", [7]), ("2-2,1", [1, 2])])
def test_partition_ranges(text, expected):
    assert admin.parse_partitions(text) == expected


@pytest.mark.parametrize("text", ["", "a", "3-1", "-1", "0-9"])
def test_bad_partition_ranges(text):
    with pytest.raises(ValueError):
        admin.parse_partitions(text, num_partitions=8)


def test_create_makes_every_znode_of_the_cluster_and_the_counters_count(zk, cluster_root):
    paths = zkmeta.ZkPaths(cluster_root)
    admin.create_cluster(zk, paths, "test", 3)

    def tree(path: str) -> list[str]:
        return [path, *(z for child in zk.get_children(path) for z in tree(f"{path}/{child}"))]

    assert sorted(tree(paths.root)) == sorted(paths.every_znode(3))
    assert zkmeta.counter(zk, paths.client_ids) == 0
    assert [zkmeta.increment(zk, paths.client_ids) for _ in range(3)] == [1, 2, 3]
    written_by_kazoo = zk.Counter(paths.server_ids)  # as an earlier version did: the count goes on
    written_by_kazoo += 5
    assert zkmeta.increment(zk, paths.server_ids) == 6
    zk.delete(paths.server_ids)  # a cluster created before the counters were
    assert zkmeta.increment(zk, paths.server_ids) == 1
    zk.set(paths.client_ids, b"junk")
    with pytest.raises(zkmeta.MetadataError, match="not a number"):
        zkmeta.increment(zk, paths.client_ids)

