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


def stream_reader(zookeeper, cluster_root, **options):
    from waltz_spark.options import parse_options
    from waltz_spark.source import WaltzStreamReader

    given = {"zookeeper": zookeeper.connect_string, "root": cluster_root, "partitions": "0-1", **options}
    return WaltzStreamReader(parse_options({k: str(v) for k, v in given.items()}))


def trigger(reader, start: dict) -> tuple[dict, list]:
    """What Spark asks the driver for one micro-batch: the end offset, then the input partitions."""
    end = reader.latestOffset(start, reader.getDefaultReadLimit())
    return end, [p.value for p in reader.partitions(start, end)]


def test_a_stream_plans_a_trigger_with_one_call_per_partition_and_no_lookup(served, zookeeper, cluster_root):
    fake, _ = served
    reader = stream_reader(zookeeper, cluster_root)
    try:
        start = reader.initialOffset()
        for n in range(5):
            fake.append(0, 3)
            start, tasks = trigger(reader, start)
            first = 0 if n == 0 else 5 + 3 * n  # the first trigger reads the 5 there before too
            assert [(t.partition, t.first, t.last, t.address) for t in tasks] == [(0, first, 7 + 3 * n, fake.address)]
        assert fake.high_water_mark_calls == 2 * 5
        assert reader._cluster().lookups == 1  # the owners, once for the whole query
    finally:
        reader.stop()


def test_a_stream_finds_a_moved_partition_again(served, zk, zookeeper, cluster_root):
    fake, _ = served
    reader = stream_reader(zookeeper, cluster_root)
    try:
        start, _ = trigger(reader, reader.initialOffset())
        with FakeWaltzServer(partitions=2) as moved:
            moved.logs = fake.logs
            moved.append(0, 2)
            register(zk, cluster_root, moved)
            fake.stop()  # the known owner is gone: the next trigger looks the owners up again
            start, tasks = trigger(reader, start)
            assert [(t.first, t.last, t.address) for t in tasks] == [(5, 6, moved.address)]
            assert reader._cluster().lookups == 2
    finally:
        reader.stop()


def test_max_bytes_per_trigger_sizes_micro_batches_by_sampled_record_sizes(served, zookeeper, cluster_root):
    fake, _ = served
    fake.append(0, 95, size=100)  # ids 5..99 weigh 100 B (ids 0..4 are smaller)
    fake.append(1, 100, size=400)
    reader = stream_reader(zookeeper, cluster_root, maxBytesPerTrigger=20 * 132)
    try:
        start = {"p0": 4, "p1": -1}
        end, tasks = trigger(reader, start)
        # 2,640 B shared evenly: partition 0 gets 1,320 B of 132 B rows, partition 1 1,320 B of 432 B rows
        assert end == {"p0": 4 + 10, "p1": -1 + 3}
        assert [(t.partition, t.first, t.last) for t in tasks] == [(0, 5, 14), (1, 0, 2)]
        assert [(r.partition_id, r.from_transaction_id, r.to_transaction_id) for r in fake.requests] == [
            (0, 84, 99),
            (1, 84, 99),
        ]  # one sample of each partition's newest 16 records
        trigger(reader, end)
        assert len(fake.requests) == 2  # the samples are kept (for a minute)
    finally:
        reader.stop()
