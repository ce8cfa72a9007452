"""SqliteClientCallbacks shared by application instances, the blocking client, the bank demo."""

import sqlite3
from pathlib import Path

import pytest

from tests.component.client.helpers import FAST, Ctx
from waltz_client import MockServer, Transaction, WaltzClient, WaltzError
from waltz_client.demo.bank import run_demo
from waltz_client.sqlite_callbacks import GuardedConnection, SqliteClientCallbacks


class Journal(SqliteClientCallbacks):
    """Records each applied transaction; the primary key makes a second apply fail loudly."""

    def create_schema(self, connection: sqlite3.Connection) -> None:
        connection.execute("CREATE TABLE IF NOT EXISTS journal (partition_id INTEGER, transaction_id INTEGER, "
                           "data BLOB, PRIMARY KEY (partition_id, transaction_id))")

    def apply(self, transaction: Transaction, connection: GuardedConnection) -> None:
        connection.execute("INSERT INTO journal VALUES (?, ?, ?)",
                           (transaction.partition_id, transaction.transaction_id, transaction.data()))


@pytest.mark.callback_modes("thread")  # applies fetch the other client's data
def test_two_instances_sharing_one_database_apply_every_transaction_exactly_once(tmp_path: Path) -> None:
    server = MockServer(2)
    db = tmp_path / "app.db"
    first, second = Journal(db), Journal(db)
    with WaltzClient(first, FAST, driver=server) as a, WaltzClient(second, FAST, driver=server) as b:
        a.wait_mounted()
        b.wait_mounted()  # both read the database's high-water marks before anything commits
        futures = [a.submit(Ctx(b"a%d" % i, partition=i)) for i in range(20)]
        futures += [b.submit(Ctx(b"b%d" % i, partition=i)) for i in range(20)]
        assert all(f.result(timeout=30) for f in futures)
        a.flush()
        b.flush()
        for c in (a, b):
            for p in (0, 1):
                while c.client_high_water_mark(p) < server.high_water_mark(p):
                    pass
    rows = first.query_all("SELECT partition_id, transaction_id, data FROM journal ORDER BY 1, 2")
    expected = [(p, r.transaction_id, r.data) for p in (0, 1) for r in server.records(p)]
    assert rows == expected and len(rows) == 40
    assert first.skipped + second.skipped == 40  # each transaction reached both; one applied it
    assert dict(first.query_all("SELECT * FROM waltz_client_high_water_mark")) == {0: 19, 1: 19}
    first.close()
    second.close()


def test_a_failed_apply_rolls_back_with_the_high_water_mark(tmp_path: Path) -> None:
    class Flaky(Journal):
        failures = 1

        def apply(self, transaction: Transaction, connection: GuardedConnection) -> None:
            super().apply(transaction, connection)
            if self.failures:
                self.failures -= 1
                raise RuntimeError("crash after the write")

    server = MockServer(1)
    callbacks = Flaky(tmp_path / "app.db")
    with WaltzClient(callbacks, FAST, driver=server) as c:
        assert c.submit(Ctx(b"x")).result(timeout=30)
    assert callbacks.query_all("SELECT transaction_id, data FROM journal") == [(0, b"x")]
    callbacks.close()


def test_apply_may_not_commit_and_a_gap_is_refused(tmp_path: Path) -> None:
    class Committer(SqliteClientCallbacks):
        def apply(self, transaction: Transaction, connection: GuardedConnection) -> None:
            connection.commit()

    callbacks = Committer(tmp_path / "app.db")
    assert callbacks.get_client_high_water_mark(0) == -1
    with pytest.raises(WaltzError, match="must not commit"):
        callbacks.apply_transaction(Transaction(0, 0, None, 0, lambda: b""))  # type: ignore[arg-type]
    with pytest.raises(WaltzError, match="cannot apply transaction 5"):
        callbacks.apply_transaction(Transaction(0, 5, None, 0, lambda: b""))  # type: ignore[arg-type]
    assert callbacks.get_client_high_water_mark(0) == -1
    callbacks.close()


def test_blocking_client_methods_refuse_to_run_inside_callbacks(tmp_path: Path) -> None:
    server = MockServer(1)
    errors: list[BaseException] = []
    holder: list[WaltzClient] = []

    class Reentrant(Ctx):
        def on_completion(self, committed: bool) -> None:
            try:
                holder[0].submit(Ctx(b"inner"))
            except WaltzError as exc:
                errors.append(exc)

    with WaltzClient(Journal(tmp_path / "app.db"), FAST, driver=server) as c:
        holder.append(c)
        assert c.submit(Reentrant(b"outer")).result(timeout=30)
        assert c.high_water_mark(0) == 0
        assert c.client_id >= 1 and c.num_partitions == 1 and c.partitions == [0]
    assert errors and "cannot be called from callbacks" in str(errors[0])
    c.close()  # idempotent


@pytest.mark.callback_modes("thread")  # SQLite applies block, and fetch other clients' data
def test_bank_demo_never_overdraws_with_concurrent_clients() -> None:
    server = MockServer(2)
    lines: list[str] = []
    report = run_demo(server, num_clients=3, num_transactions=150, client_config=FAST, out=lines.append)
    assert report.ok, report.problems
    assert report.lowest_balance >= 0 and report.committed > 0 and report.declined > 0
    assert report.applied == sum(h + 1 for h in report.high_water_marks.values())
    assert any("consistency: OK" in line for line in lines)


@pytest.mark.callback_modes("thread")  # SQLite applies block, and fetch other clients' data
def test_bank_demo_survives_lost_appends_and_cut_streams() -> None:
    server = MockServer(2)
    server.set_fault_rate(0.05)
    server.set_max_delay(0.002)
    report = run_demo(server, num_clients=2, num_transactions=80, client_config=FAST, out=None)
    assert report.ok, report.problems
    assert report.retries > 0


@pytest.mark.callback_modes("thread")  # its apply blocks
def test_close_while_an_apply_waits_for_data_does_not_deadlock(tmp_path: Path) -> None:
    import threading

    server = MockServer(1)
    entered, release = threading.Event(), threading.Event()

    class Slow(Journal):
        def apply(self, transaction: Transaction, connection: GuardedConnection) -> None:
            entered.set()
            release.wait(10)
            super().apply(transaction, connection)  # fetches the data through the closing client

    with WaltzClient(Journal(tmp_path / "a.db"), FAST, driver=server) as writer:
        assert writer.submit(Ctx(b"x")).result(timeout=30)
    reader = WaltzClient(Slow(tmp_path / "b.db"), FAST, driver=server)
    assert entered.wait(10)
    closer = threading.Thread(target=reader.close)
    closer.start()
    release.set()
    closer.join(30)
    assert not closer.is_alive()
