"""PostgresClientCallbacks on a real PostgreSQL: instances sharing one database, rollbacks, reconnects."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import psycopg
import pytest

from tests.component.client.helpers import FAST, Ctx
from waltz_client import MockServer, Transaction, WaltzClient, WaltzError
from waltz_client.postgres_callbacks import DatabaseUnavailableError, PgGuardedConnection, PostgresClientCallbacks
from waltz_common.testing.local_cluster import free_port


class Journal(PostgresClientCallbacks):
    """Records each applied transaction; no unique key, so that a second apply shows as a second row."""

    def create_schema(self, connection: PgGuardedConnection) -> None:
        connection.execute("CREATE TABLE IF NOT EXISTS journal (partition_id INTEGER, transaction_id BIGINT, "
                           "data BYTEA)")

    def apply(self, transaction: Transaction, connection: PgGuardedConnection) -> None:
        connection.execute("INSERT INTO journal VALUES (%s, %s, %s)",
                           (transaction.partition_id, transaction.transaction_id, transaction.data()))


def _transaction(pid: int, txn_id: int, data: bytes = b"") -> Transaction:
    return Transaction(pid, txn_id, None, 0, lambda: data)  # type: ignore[arg-type]


@pytest.mark.callback_modes("thread")  # applies fetch the other client's data
def test_two_instances_sharing_one_database_apply_every_transaction_exactly_once(postgres_dsn: str) -> None:
    server = MockServer(2)
    first, second = Journal(postgres_dsn), Journal(postgres_dsn)
    with WaltzClient(first, FAST, driver=server) as a, WaltzClient(second, FAST, driver=server) as b:
        a.wait_mounted()
        b.wait_mounted()
        futures = [a.submit(Ctx(b"a%d" % i, partition=i)) for i in range(20)]
        futures += [b.submit(Ctx(b"b%d" % i, partition=i)) for i in range(20)]
        assert all(f.result(timeout=30) for f in futures)
        a.flush()
        b.flush()
        deadline = time.monotonic() + 30
        while any(c.client_high_water_mark(p) < server.high_water_mark(p) for c in (a, b) for p in (0, 1)):
            assert time.monotonic() < deadline
            time.sleep(0.01)
    rows = first.query_all("SELECT partition_id, transaction_id, data FROM journal ORDER BY 1, 2")
    expected = [(p, r.transaction_id, r.data) for p in (0, 1) for r in server.records(p)]
    assert rows == expected and len(rows) == 40
    assert first.skipped + second.skipped == 40  # each transaction reached both; one applied it
    assert dict(first.query_all("SELECT * FROM waltz_client_high_water_mark")) == {0: 19, 1: 19}
    first.close()
    second.close()


@pytest.mark.callback_modes("thread")
def test_racing_instances_each_transaction_is_applied_by_exactly_one(postgres_dsn: str) -> None:
    """Four instances apply the same 200 transactions at once: the row lock lets exactly one apply each."""
    instances = [Journal(postgres_dsn) for _ in range(4)]
    barrier = threading.Barrier(len(instances))
    errors: list[BaseException] = []

    def feed(instance: Journal) -> None:
        try:
            barrier.wait()
            for txn_id in range(200):
                instance.apply_transaction(_transaction(txn_id % 2, txn_id // 2, b"%d" % txn_id))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=feed, args=(i,)) for i in instances]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    rows = instances[0].query_all("SELECT partition_id, transaction_id, count(*) FROM journal GROUP BY 1, 2")
    assert sorted(rows) == [(p, t, 1) for p in (0, 1) for t in range(100)]
    assert sum(i.skipped for i in instances) == 3 * 200
    for instance in instances:
        instance.close()


@pytest.mark.callback_modes("thread")
def test_a_failed_apply_rolls_back_with_the_high_water_mark(postgres_dsn: str) -> None:
    class Flaky(Journal):
        failures = 1

        def apply(self, transaction: Transaction, connection: PgGuardedConnection) -> None:
            super().apply(transaction, connection)
            if self.failures:
                self.failures -= 1
                raise RuntimeError("crash after the write")

    server = MockServer(1)
    callbacks = Flaky(postgres_dsn)
    with WaltzClient(callbacks, FAST, driver=server) as c:
        assert c.submit(Ctx(b"x")).result(timeout=30)
    assert callbacks.query_all("SELECT transaction_id, data FROM journal") == [(0, b"x")]
    assert callbacks.get_client_high_water_mark(0) == 0
    callbacks.close()


@pytest.mark.callback_modes("thread")
def test_apply_may_not_commit_and_a_gap_is_refused(postgres_dsn: str) -> None:
    class Committer(PostgresClientCallbacks):
        def apply(self, transaction: Transaction, connection: PgGuardedConnection) -> None:
            connection.commit()

    callbacks = Committer(postgres_dsn, table="marks")
    assert callbacks.get_client_high_water_mark(0) == -1
    with pytest.raises(WaltzError, match="must not commit"):
        callbacks.apply_transaction(_transaction(0, 0))
    with pytest.raises(WaltzError, match="cannot apply transaction 5"):
        callbacks.apply_transaction(_transaction(0, 5))
    assert callbacks.get_client_high_water_mark(0) == -1
    with pytest.raises(ValueError, match="table name"):
        Committer(postgres_dsn, table="marks; DROP TABLE x")
    callbacks.close()


@pytest.mark.callback_modes("thread")
def test_an_unreachable_database_is_a_clear_error_at_once() -> None:
    port = free_port()  # nothing listens there
    started = time.monotonic()
    with pytest.raises(DatabaseUnavailableError, match=rf"cannot connect to PostgreSQL at app@127.0.0.1:{port}/bank"):
        Journal(f"postgresql://app:secret@127.0.0.1:{port}/bank", connect_timeout=2)
    assert time.monotonic() - started < 10
    try:
        Journal(f"postgresql://app:secret@127.0.0.1:{port}/bank", connect_timeout=2)
    except DatabaseUnavailableError as exc:
        assert "secret" not in str(exc)


@pytest.mark.callback_modes("thread")
def test_a_lost_connection_is_reopened_and_the_apply_tried_again(postgres_dsn: str) -> None:
    journal = Journal(postgres_dsn)
    journal.get_client_high_water_mark(0)
    journal.apply_transaction(_transaction(0, 0, b"before"))
    backend = journal.connect().info.backend_pid
    with psycopg.connect(postgres_dsn, autocommit=True) as admin:
        assert admin.execute("SELECT pg_terminate_backend(%s)", (backend,)).fetchone() == (True,)
    journal.apply_transaction(_transaction(0, 1, b"after"))  # finds the connection dead, reconnects
    assert journal.reconnects == 1
    assert journal.query_all("SELECT transaction_id, data FROM journal ORDER BY 1") == [(0, b"before"), (1, b"after")]
    assert journal.connect().info.backend_pid != backend
    journal.close()


@pytest.mark.callback_modes("thread")
def test_a_database_down_for_longer_than_reconnect_timeout_raises(postgres_dsn: str) -> None:
    journal = Journal(postgres_dsn, reconnect_timeout=0.5)
    journal.conninfo = journal.conninfo.replace(postgres_dsn.split("@")[1].split("/")[0], f"127.0.0.1:{free_port()}")
    journal.connect().close()  # the next call must reconnect, to a port where nothing listens
    with pytest.raises(DatabaseUnavailableError, match=r"kept failing for 0\.5 s"):
        journal.apply_transaction(_transaction(0, 0))
    journal.close()


HOLDER = """
import sys, time
from tests.component.client.test_postgres_callbacks import Journal, _transaction

class Stuck(Journal):
    def apply(self, transaction, connection):
        super().apply(transaction, connection)
        print("holding", flush=True)  # inside the database transaction, the partition's row locked
        time.sleep(600)

Stuck(sys.argv[1]).apply_transaction(_transaction(0, 0, b"lost"))
"""


@pytest.mark.callback_modes("thread")
def test_an_instance_killed_inside_its_apply_releases_the_partition_to_the_others(postgres_dsn: str) -> None:
    survivor = Journal(postgres_dsn)
    survivor.get_client_high_water_mark(0)
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, postgres_dsn], stdout=subprocess.PIPE, text=True,
                              cwd=Path(__file__).resolve().parents[3])
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "holding"
        holder.kill()  # kill -9 with the row lock held and the journal row written, not committed
        holder.wait(30)
        started = time.monotonic()
        survivor.apply_transaction(_transaction(0, 0, b"kept"))
        assert time.monotonic() - started < 10  # PostgreSQL rolled the dead session back, freeing the lock
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait(30)
    assert survivor.query_all("SELECT transaction_id, data FROM journal") == [(0, b"kept")]
    assert survivor.skipped == 0 and survivor.get_client_high_water_mark(0) == 0
    survivor.close()
