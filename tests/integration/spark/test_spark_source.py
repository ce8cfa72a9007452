"""The waltz source and the ingest job in local Spark against a real local cluster (and one corrupt fake)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator

import pytest

from tests.integration.spark.appender import append
from waltz_common import cluster_admin
from waltz_common import zk as zkmeta
from waltz_common.testing.local_cluster import LocalCluster
from waltz_spark import ingest
from waltz_spark.testing import FakeWaltzServer, local_spark, register

pytestmark = pytest.mark.spark
PARTITIONS = 3


@pytest.fixture(scope="module")
def spark() -> Iterator:
    session = local_spark("waltz-spark-tests")
    try:
        yield session
    finally:
        session.stop()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path_factory.mktemp("cluster"), storage_nodes=3, servers=1, partitions=PARTITIONS) as c:
        yield c


def payload(partition: int, n: int) -> bytes:
    return json.dumps({"n": n, "word": f"w{partition}-{n}"}).encode()


def waltz(spark, cluster: LocalCluster, **options):
    reader = spark.read.format("waltz").option("zookeeper", cluster.zookeeper).option("root", cluster.paths.root)
    return reader.options(**{k: str(v) for k, v in options.items()}).load()


def test_a_batch_read_equals_what_was_appended(spark, cluster):
    # The first test on the module's fresh cluster: the log holds exactly what it appends.
    items = [(p, n % 5, payload(p, n)) for n in range(120) for p in range(PARTITIONS) if not (p == 2 and n >= 40)]
    feed = append(cluster.client_config(), items)

    rows = waltz(spark, cluster, recordsPerTask=50).collect()
    assert len(rows) == len(feed) == len(items)
    by_partition: dict[int, list] = {}
    for row in rows:
        by_partition.setdefault(row.partition, []).append(row)
    for pid, got in by_partition.items():
        got.sort(key=lambda r: r.transaction_id)
        assert [r.transaction_id for r in got] == list(range(len(got)))  # dense, from 0, no duplicates
        assert sorted((r.header, r.data) for r in got) == sorted((h, d) for p, h, d in items if p == pid)
        for r in got:
            assert (r.client_id, r.generation, r.seq_num, r.header) == feed[(pid, r.transaction_id)]

    some = waltz(spark, cluster, partitions="1-2", startingOffsets='{"1": 100}', endingOffsets='{"2": 9}').collect()
    assert sorted((r.partition, r.transaction_id) for r in some) == [(1, t) for t in range(100, 120)] + [
        (2, t) for t in range(10)
    ]


def test_a_batch_read_from_server_addresses_alone(spark, cluster, monkeypatch):
    """Option servers only: the driver (ZooKeeper refused in this process) and the executors (given no ZooKeeper
    address) plan and read from the servers' GetClusterInfo."""
    from kazoo.client import KazooClient

    expected = sorted((r.partition, r.transaction_id, r.data) for r in waltz(spark, cluster).collect())

    def refuse(self: KazooClient, *args: object, **kwargs: object) -> None:
        raise AssertionError("the client side tried to reach ZooKeeper")

    monkeypatch.setattr(KazooClient, "start", refuse)
    df = spark.read.format("waltz").option("servers", cluster.servers[0].address).load()
    assert sorted((r.partition, r.transaction_id, r.data) for r in df.collect()) == expected


def test_streaming_ingest_restarts_from_its_checkpoint_exactly_once(spark, cluster, tmp_path):
    root = cluster.paths.root
    out = tmp_path / "parquet"
    argv = [
        "--zookeeper",
        cluster.zookeeper,
        "--root",
        root,
        "--output",
        str(out),
        "--decoder",
        "waltz_spark.decoders:json_columns",
        "--decoder-option",
        "schema=n INT, word STRING",
        "--max-records-per-partition",
        "70",
        "--spark-log-level",
        "WARN",
    ]
    append(cluster.client_config(), [(p, 100, payload(p, 1000 + n)) for n in range(50) for p in range(PARTITIONS)])
    committed = sum(spark_hwm(spark, cluster, p) + 1 for p in range(PARTITIONS))
    assert ingest.main(argv) == 0
    assert spark.read.parquet(str(out)).count() == committed
    append(cluster.client_config(), [(p, 200, payload(p, 2000 + n)) for n in range(60) for p in (0, 2)])
    assert ingest.main(argv) == 0
    assert ingest.main(argv) == 0  # nothing new: lands nothing

    landed = spark.read.parquet(str(out))
    assert set(landed.columns) == {
        "partition",
        "transaction_id",
        "header",
        "client_id",
        "generation",
        "seq_num",
        "n",
        "word",
    }
    assert sorted(os.listdir(out)) == ["_checkpoint", "_spark_metadata"] + [f"partition={p}" for p in range(3)]
    keys = sorted((r.partition, r.transaction_id) for r in landed.select("partition", "transaction_id").collect())
    expected = sorted((p, t) for p in range(PARTITIONS) for t in range(spark_hwm(spark, cluster, p) + 1))
    assert keys == expected  # every committed transaction exactly once: no duplicates, no gaps
    words = {r.word for r in landed.where("header = 200").select("word").collect()}
    assert words == {f"w{p}-{2000 + n}" for n in range(60) for p in (0, 2)}


def spark_hwm(spark, cluster: LocalCluster, partition: int) -> int:
    from waltz_spark.cluster import ClusterDirectory

    with ClusterDirectory(cluster.zookeeper, cluster.paths.root) as directory:
        return directory.high_water_marks([partition])[partition]


def test_a_corrupt_record_fails_the_read_naming_it(spark, cluster):
    root = "/spark-corrupt"
    zk = zkmeta.connect(cluster.zookeeper)
    try:
        cluster_admin.create_cluster(zk, zkmeta.ZkPaths(root), "corrupt", 1)
        with FakeWaltzServer(partitions=1) as fake:
            fake.append(0, 30)
            fake.corrupt(0, 17)
            register(zk, root, fake)
            df = spark.read.format("waltz").option("zookeeper", cluster.zookeeper).option("root", root).load()
            with pytest.raises(Exception, match="checksum mismatch in partition 0 transaction 17"):
                df.collect()
    finally:
        zk.stop()
        zk.close()


def test_a_batch_read_over_mutual_tls(spark, tmp_path):
    """The client library appends with an application certificate; the source reads with the tls.* options."""
    with LocalCluster(tmp_path, storage_nodes=3, servers=1, partitions=1, tls=True) as secure:
        items = [(0, 1, payload(0, n)) for n in range(30)]
        feed = append(secure.client_config(), items)
        options = secure.tls_config("application")
        rows = waltz(spark, secure, **options).collect()
        assert sorted(r.transaction_id for r in rows) == sorted(t for _, t in feed) == list(range(30))
        assert sorted(r.data for r in rows) == sorted(d for _, _, d in items)
