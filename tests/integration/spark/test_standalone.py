"""waltz-ingest on a Spark standalone cluster started by hand: exactly once across a query stopped mid-stream.

Bounded by default (a few hundred transactions); WALTZ_SLOW=1 appends 20 times more.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from urllib.parse import unquote, urlparse

import pyarrow.parquet as pq
import pytest

from tests.integration.spark.appender import append
from tests.integration.spark.standalone import StandaloneSpark
from waltz_common.testing.local_cluster import LocalCluster
from waltz_spark.cluster import ClusterDirectory

pytestmark = [pytest.mark.spark, pytest.mark.slow]  # serial: tests/conftest.py SERIAL
PARTITIONS = 2
SCALE = 20 if os.environ.get("WALTZ_SLOW") == "1" else 1


def landed(out: Path) -> Counter[tuple[int, int]]:
    """(partition, transaction id) of every row in the files the sink's _spark_metadata log committed."""
    files: set[str] = set()
    for entry in (out / "_spark_metadata").iterdir():
        if entry.name.startswith("."):
            continue
        lines = entry.read_text().splitlines()[1:]  # after the version line, one JSON object per file
        files.update(json.loads(line)["path"] for line in lines)
    rows: Counter[tuple[int, int]] = Counter()
    for uri in files:
        path = Path(unquote(urlparse(uri).path))
        partition = int(path.parent.name.removeprefix("partition="))
        for tid in pq.read_table(path, columns=["transaction_id"]).column(0).to_pylist():
            rows[(partition, tid)] += 1
    return rows


def committed(cluster: LocalCluster) -> set[tuple[int, int]]:
    with ClusterDirectory(cluster.zookeeper, cluster.paths.root) as directory:
        hwms = directory.high_water_marks(range(PARTITIONS))
    return {(p, t) for p, hwm in hwms.items() for t in range(hwm + 1)}


def test_ingest_on_a_standalone_cluster_is_exactly_once_across_a_stopped_query(tmp_path):
    with (
        LocalCluster(tmp_path / "waltz", storage_nodes=3, servers=1, partitions=PARTITIONS) as cluster,
        StandaloneSpark(tmp_path / "spark", cores=2) as spark,
    ):
        out = tmp_path / "parquet"
        argv = [
            sys.executable, "-m", "waltz_spark.ingest",
            "--zookeeper", cluster.zookeeper, "--root", cluster.paths.root, "--output", str(out),
            "--master", spark.master, "--max-records-per-partition", str(40 * SCALE),
            "--conf", "spark.executor.memory=512m", "--conf", "spark.sql.shuffle.partitions=2",
        ]  # fmt: skip

        def ingest(*extra: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run([*argv, *extra], env=spark.env(), capture_output=True, text=True, timeout=300)

        # A continuous query stopped by SIGTERM after two batches of several: the one running may be cut short
        append(cluster.client_config(), [(p, 1, b"t%d" % n) for n in range(300 * SCALE) for p in range(PARTITIONS)])
        metadata = out / "_spark_metadata"
        running = subprocess.Popen(
            [*argv, "--continuous", "--interval", "1 second"],
            env=spark.env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            deadline = time.monotonic() + 240
            while not (metadata / "1").exists() and running.poll() is None:
                assert time.monotonic() < deadline, "the continuous query landed nothing"
                time.sleep(0.2)
            running.send_signal(signal.SIGTERM)
            _, stderr = running.communicate(timeout=120)
        finally:
            if running.poll() is None:
                running.kill()
                running.wait()
        assert running.returncode == 0, stderr[-3000:]
        assert 0 < sum(landed(out).values()) < len(committed(cluster))

        restarted = ingest()  # from the checkpoint: lands the rest, nothing twice
        assert restarted.returncode == 0, restarted.stderr[-3000:]
        rows = landed(out)
        assert set(rows) == committed(cluster)
        assert max(rows.values()) == 1
        assert len(rows) == PARTITIONS * 300 * SCALE
        # the executors ran on the hand-started worker, not in a local master
        assert list((tmp_path / "spark" / "work").glob("app-*/*/stderr"))
