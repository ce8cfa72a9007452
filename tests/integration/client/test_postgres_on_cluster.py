"""Two application instances (processes) share one PostgreSQL database on a real cluster; one is killed
with kill -9 mid stream; every transaction ends up applied exactly once."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from waltz_client.demo.bank import run_demo
from waltz_common.testing.local_cluster import LocalCluster
from waltz_common.testing.zookeeper import ZooKeeperProcess

INSTANCE = Path(__file__).with_name("pg_instance.py")
FAST = {"client.longWaitThresholdSeconds": 0.5, "client.mountTimeout": 60, "client.requestTimeout": 60}


@pytest.fixture(scope="module")
def cluster(zookeeper: ZooKeeperProcess, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    workdir = tmp_path_factory.mktemp("pg-cluster")
    with LocalCluster(workdir, storage_nodes=3, servers=1, partitions=2, cluster_root=f"/test/{uuid.uuid4().hex[:12]}",
                      zookeeper=zookeeper.connect_string) as c:
        yield c


class Instance:
    """pg_instance.py as a child process, its stdout lines collected by a thread."""

    def __init__(self, dsn: str, config: Path, name: str, count: int) -> None:
        self.name = name
        self.lines: list[str] = []
        self.process = subprocess.Popen([sys.executable, str(INSTANCE), dsn, str(config), name, str(count)],
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line.rstrip("\n"))

    def committed(self) -> int:
        counts = [int(line.split()[1]) for line in self.lines if line.startswith("committed ")]
        return counts[-1] if counts else 0

    def wait_for(self, check: object, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not check():  # type: ignore[operator]
            if self.process.poll() is not None and not check():  # type: ignore[operator]
                self._reader.join(5)
                raise AssertionError(f"{self.name} exited with {self.process.returncode}: {self.lines[-30:]}")
            if time.monotonic() > deadline:
                raise AssertionError(f"{self.name}: not reached in {timeout:g} s: {self.lines[-30:]}")
            time.sleep(0.02)

    def finish(self, timeout: float = 180) -> dict[int, int]:
        """Wait for `done`; the high-water marks it printed."""
        self.wait_for(lambda: "done" in self.lines, timeout)
        assert self.process.wait(30) == 0
        return {int(p): int(h) for _, p, h in (line.split() for line in self.lines if line.startswith("hwm "))}

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(30)


@pytest.mark.slow
def test_two_instances_one_killed_mid_stream_apply_every_transaction_exactly_once(
        cluster: LocalCluster, postgres_dsn: str) -> None:
    config = cluster.write_client_config("pg-client.yaml", **FAST)
    a = Instance(postgres_dsn, config, "a", 400)
    b = Instance(postgres_dsn, config, "b", 150)
    instances = [a, b]
    try:
        a.wait_for(lambda: a.committed() >= 40, 120)
        a.process.kill()  # kill -9, mid stream: appends in flight, maybe an apply's database transaction open
        a.process.wait(30)
        killed_after = a.committed()
        b.finish()
        restarted = Instance(postgres_dsn, config, "a2", 0)  # the killed instance back: it catches up only
        instances.append(restarted)
        hwms = restarted.finish()
    finally:
        for each in instances:
            each.stop()
    assert killed_after < 400, "the kill came too late to be mid stream"
    applied, batches = next((int(line.split()[1]), int(line.split()[3])) for line in b.lines
                            if line.startswith("applied "))
    assert 0 < batches <= applied  # the helper applied the feed in batches (apply_transactions)
    with psycopg.connect(postgres_dsn) as conn:
        rows = conn.execute("SELECT partition_id, transaction_id, data, count(*) FROM journal "
                            "GROUP BY 1, 2, 3").fetchall()
        marks = dict(conn.execute("SELECT partition_id, high_water_mark FROM waltz_client_high_water_mark").fetchall())
    assert marks == hwms
    ids = sorted((p, t) for p, t, _, _ in rows)
    assert ids == [(p, t) for p in sorted(hwms) for t in range(hwms[p] + 1)]  # dense, each id once
    assert all(n == 1 for *_, n in rows), [r for r in rows if r[3] != 1]  # applied exactly once
    data = [d for _, _, d, _ in rows]
    assert len(data) == len(set(data))  # no transaction committed twice either
    assert {f"b-{i}" for i in range(150)} <= set(data)  # everything b committed
    assert {f"a-{i}" for i in range(killed_after)} <= set(data)  # everything a saw committed before it died


def test_bank_demo_on_postgres(cluster: LocalCluster, postgres_dsn: str) -> None:
    lines: list[str] = []
    report = run_demo(cluster.client_config(), num_clients=2, num_transactions=40, client_config=FAST,
                      database=postgres_dsn, out=lines.append)
    assert report.ok, (report.problems, lines)
    assert report.applied == report.committed > 4  # the deposits and some withdrawals, once each
    assert report.skipped_duplicates >= report.applied  # both instances got each one; one applied it
