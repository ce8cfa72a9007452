"""Shared fixtures: one real ZooKeeper (and, for the tests that ask, one PostgreSQL) for the test session,
and a fresh cluster root (a fresh PostgreSQL database) per test."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from kazoo.client import KazooClient

from waltz_common import zk as zkmeta
from waltz_common.testing.postgres import PostgresProcess
from waltz_common.testing.zookeeper import ZooKeeperProcess

SERIAL = frozenset({
    # the container engine and the images are machine-wide (tests/deploy/conftest.py prepares them once)
    "tests/deploy/test_containers.py",
    # timing-sensitive: what they assert holds on a busy machine, not beside the parallel pass's other clusters
    "tests/chaos/test_pause_soak.py",  # 1 s SIGSTOPs of an owner must move no partition
    "tests/integration/client/test_contention.py",  # every instance's share of the commits
})
"""Test files marked serial: scripts/test runs them alone after the parallel pass (pytest -n, the rest)."""
ROOT = Path(__file__).resolve().parent.parent


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "serial: run alone, after the parallel pass (see tests/conftest.py SERIAL)")


@pytest.hookimpl(tryfirst=True)  # before -m deselects by marker
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Marks the SERIAL files' tests serial, and keeps the tests of a file that share a module-scoped fixture (a
    cluster, a Spark session) on one pytest-xdist worker (--dist loadgroup), which then sets it up once."""
    for item in items:
        path = item.path.resolve().relative_to(ROOT).as_posix()
        if path in SERIAL:
            item.add_marker(pytest.mark.serial)
        fixtures = getattr(item, "_fixtureinfo", None)
        defs = fixtures.name2fixturedefs.values() if fixtures is not None else ()
        if any(d[-1].scope in ("module", "package") for d in defs if d):
            item.add_marker(pytest.mark.xdist_group(path))


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
