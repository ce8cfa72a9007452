"""Shared fixtures: one real ZooKeeper (and, for the tests that ask, one PostgreSQL) for the test session,
and a fresh cluster root (a fresh PostgreSQL database) per test."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from kazoo.client import KazooClient

from waltz_common import zk as zkmeta
from waltz_common.testing.postgres import PostgresProcess
from waltz_common.testing.zookeeper import ZooKeeperProcess

settings.register_profile("waltz", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("waltz")
"""Property tests check what happens, not how fast: the parallel pass shares two cores with clusters, so Hypothesis's
per-example deadline (200 ms) and its slow-generation health check failed correct tests (a storage record test took
296 ms once and 0.45 ms when Hypothesis re-ran it)."""

SERIAL = frozenset({
    # the container engine and the images are machine-wide (tests/deploy/conftest.py prepares them once)
    "tests/deploy/test_containers.py",
    # timing-sensitive: what they assert holds on a busy machine, not beside the parallel pass's other clusters
    "tests/chaos/test_pause_soak.py",  # 1 s SIGSTOPs of an owner must move no partition
    "tests/integration/client/test_contention.py",  # every instance's share of the commits
    # Spark's JVM waits 10 s for each Python worker it starts to connect back: beside the parallel pass's clusters
    # it did not ("Python worker failed to connect back", 1 run of 2)
    "tests/integration/spark/test_spark_source.py",
    "tests/integration/spark/test_standalone.py",  # a Spark master and worker of its own, the same JVM waits
})
"""Test files marked serial: scripts/test runs them alone after the parallel pass (pytest -n, the rest)."""
ROOT = Path(__file__).resolve().parent.parent


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "serial: run alone, after the parallel pass (see tests/conftest.py SERIAL)")


def pytest_itemcollected(item: pytest.Item) -> None:
    """Marks the SERIAL files' tests serial (here, as each test is collected: -m reads the marks after)."""
    if item.path.resolve().relative_to(ROOT).as_posix() in SERIAL:
        item.add_marker(pytest.mark.serial)


def shared_fixture_files() -> frozenset[str]:
    """The test files that define a module-scoped fixture (a cluster, a Spark session)."""
    found = (p for p in (ROOT / "tests").rglob("test_*.py") if re.search(r"scope=.(module|package)", p.read_text()))
    return frozenset(p.relative_to(ROOT).as_posix() for p in found)


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """With --dist loadscope: each test is a unit of its own, except that the tests of a file with a module-scoped
    fixture go to one worker together, which sets the fixture up once (xdist's loadgroup marks do not reach its
    scheduler under pytest 9: the node ids it reads lack the group)."""
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling  # type: ignore[import-untyped]

    grouped = shared_fixture_files()

    class SharedFixtureScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return path if path in grouped else nodeid

    return SharedFixtureScheduling(config, log)


@pytest.fixture(scope="session")
def zookeeper(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ZooKeeperProcess]:
    """A standalone ZooKeeper on 127.0.0.1 (installed from Debian's package when missing)."""
    process = ZooKeeperProcess(tmp_path_factory.mktemp("zookeeper"))
    process.start()
    try:
        yield process
    finally:
        process.stop()


@pytest.fixture
def zk(zookeeper: ZooKeeperProcess) -> Iterator[KazooClient]:
    client = zkmeta.connect(zookeeper.connect_string)
    try:
        yield client
    finally:
        client.stop()
        client.close()


@pytest.fixture
def cluster_root() -> str:
    """A unique cluster root, so tests sharing the ZooKeeper never see each other's znodes."""
    return f"/test/{uuid.uuid4().hex[:12]}"


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresProcess]:
    """A PostgreSQL server on 127.0.0.1 (initdb in a temporary directory, run as a non-root user)."""
    process = PostgresProcess()
    process.start()
    try:
        yield process
    finally:
        process.stop()


@pytest.fixture
def postgres_dsn(postgres: PostgresProcess) -> str:
    """A fresh, empty database on the session's PostgreSQL; its connection URI."""
    import psycopg

    name = f"test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(postgres.dsn(), autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    return postgres.dsn(name)
