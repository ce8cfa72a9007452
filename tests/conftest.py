"""Shared fixtures: one real ZooKeeper (and, for the tests that ask, one PostgreSQL) for the test session,
and a fresh cluster root (a fresh PostgreSQL database) per test."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from kazoo.client import KazooClient

from waltz_common import zk as zkmeta
from waltz_common.testing.postgres import PostgresProcess
from waltz_common.testing.zookeeper import ZooKeeperProcess


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
