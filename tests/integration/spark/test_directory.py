"""ClusterDirectory against a real ZooKeeper with a fake WaltzServer registered as the owner."""

import pytest

from waltz_common import cluster_admin
from waltz_common import zk as zkmeta
from waltz_common.zk import MetadataError
from waltz_spark.cluster import ClusterDirectory, PartitionUnavailable
from waltz_spark.testing import FakeWaltzServer, register


@pytest.fixture
def served(zk, zookeeper, cluster_root):
    cluster_admin.create_cluster(zk, zkmeta.ZkPaths(cluster_root), "t", 3)
    with FakeWaltzServer(partitions=2) as fake:
        fake.append(0, 5)
        register(zk, cluster_root, fake)
        with ClusterDirectory(zookeeper.connect_string, cluster_root, timeout_s=1.0) as directory:
            yield fake, directory


def test_partitions_owners_and_high_water_marks(served):
    fake, directory = served
    assert directory.num_partitions() == 3
    assert directory.select(None) == [0, 1, 2]
    assert directory.select("0-1") == [0, 1]
    assert directory.owners() == {0: fake.address, 1: fake.address}
    assert directory.high_water_marks([0, 1]) == {0: 4, 1: -1}


def test_unknown_partition_and_unowned_partition_are_clear_errors(served):
    _, directory = served
    with pytest.raises(ValueError, match="partition 7 does not exist"):
        directory.select("0,7")
    with pytest.raises(PartitionUnavailable, match="partition 2 has no live server"):
        directory.high_water_marks([2])


def test_unreachable_zookeeper_is_a_clear_error():
    with pytest.raises(MetadataError, match=r"cannot reach ZooKeeper at 127\.0\.0\.1:1"):
        ClusterDirectory("127.0.0.1:1", "/waltz", timeout_s=0.5)


def test_missing_cluster_says_so(zookeeper):
    with (
        ClusterDirectory(zookeeper.connect_string, "/no/such/cluster", timeout_s=1.0) as directory,
        pytest.raises(MetadataError, match="has the cluster been created"),
    ):
        directory.num_partitions()
