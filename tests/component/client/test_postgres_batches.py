"""The PostgreSQL helpers (sync and async) and the SQLite one apply a batch in one database transaction with one
high-water-mark update: all of it or none, transactions another instance applied skipped, exactly once."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

import psycopg
import pytest

from tests.component.client.helpers import FAST, Ctx, MemoryCallbacks
from waltz_client import AsyncWaltzClient, MockServer, Transaction, TransactionBuilder, WaltzClient, WaltzError
from waltz_client.postgres_async import AsyncPgGuardedConnection, AsyncPostgresClientCallbacks
from waltz_client.postgres_callbacks import PgGuardedConnection, PostgresClientCallbacks
from waltz_client.sqlite_callbacks import GuardedConnection, SqliteClientCallbacks


def _batch(first: int, count: int, partition: int = 0) -> list[Transaction]:
    return [Transaction(partition, i, None, 0, lambda: b"", b"t%d" % i)  # type: ignore[arg-type]
            for i in range(first, first + count)]


class PgJournal(PostgresClientCallbacks):
    """A row per apply and no unique key: an apply twice shows as two rows. fail_at: raise on that id (once)."""

    fail_at: int | None = None
    statements = 0

    def create_schema(self, connection: PgGuardedConnection) -> None:
        connection.execute("CREATE TABLE IF NOT EXISTS journal (partition_id INTEGER, transaction_id BIGINT, "
                           "data BYTEA)")

    def apply(self, transaction: Transaction, connection: PgGuardedConnection) -> None:
        if transaction.transaction_id == self.fail_at:
            self.fail_at = None
            raise RuntimeError("constraint violated")
        connection.execute("INSERT INTO journal VALUES (%s, %s, %s)",
                           (transaction.partition_id, transaction.transaction_id, transaction.data()))


class SqliteJournal(SqliteClientCallbacks):
    fail_at: int | None = None

    def create_schema(self, connection: sqlite3.Connection) -> None:
        connection.execute("CREATE TABLE IF NOT EXISTS journal (partition_id INTEGER, transaction_id INTEGER, "
                           "data BLOB)")

    def apply(self, transaction: Transaction, connection: GuardedConnection) -> None:
        if transaction.transaction_id == self.fail_at:
            self.fail_at = None
            raise RuntimeError("constraint violated")
        connection.execute("INSERT INTO journal VALUES (?, ?, ?)",
                           (transaction.partition_id, transaction.transaction_id, transaction.data()))


class AsyncJournal(AsyncPostgresClientCallbacks):
    async def create_schema(self, connection: AsyncPgGuardedConnection) -> None:
        await connection.execute("CREATE TABLE IF NOT EXISTS journal (partition_id INTEGER, transaction_id BIGINT, "
                                 "data BYTEA)")

    async def apply(self, transaction: Transaction, connection: AsyncPgGuardedConnection) -> None:
        await connection.execute("INSERT INTO journal VALUES (%s, %s, %s)",
                                 (transaction.partition_id, transaction.transaction_id, transaction.data()))


def _ids(rows: Sequence[tuple[int, ...]]) -> list[int]:
    return [row[0] for row in rows]


@pytest.mark.callback_modes("thread")
def test_a_postgres_batch_is_one_transaction_all_or_nothing_and_skips_what_another_applied(postgres_dsn: str) -> None:
    with PgJournal(postgres_dsn) as first, PgJournal(postgres_dsn) as second:
        assert first.get_client_high_water_mark(0) == -1
        first.apply_transactions(_batch(0, 50))
        assert first.query_all("SELECT count(DISTINCT xmin::text) FROM journal") == [(1,)]  # one transaction
        first.fail_at = 57
        with pytest.raises(RuntimeError, match="constraint violated"):
            first.apply_transactions(_batch(50, 10))  # rolled back whole: nothing of 50..59, the mark stays
        assert first.get_client_high_water_mark(0) == 49
        second.apply_transactions(_batch(40, 30))  # 40..49 applied by the first instance: skipped
        assert second.skipped == 10
        with pytest.raises(WaltzError, match="cannot apply transaction 80"):
            second.apply_transactions(_batch(80, 5))
        rows = first.query_all("SELECT transaction_id FROM journal ORDER BY 1")
        assert _ids(rows) == list(range(70))  # each once
        assert first.get_client_high_water_mark(0) == 69


@pytest.mark.callback_modes("thread")
def test_a_sqlite_batch_is_one_transaction_all_or_nothing_and_skips_what_another_applied(tmp_path: Path) -> None:
    database = tmp_path / "app.db"
    with SqliteJournal(database) as first, SqliteJournal(database) as second:
        first.apply_transactions(_batch(0, 50))  # no get_client_high_water_mark first: the row is made
        first.fail_at = 57
        with pytest.raises(RuntimeError, match="constraint violated"):
            first.apply_transactions(_batch(50, 10))
        assert first.get_client_high_water_mark(0) == 49
        second.apply_transactions(_batch(40, 30))
        assert second.skipped == 10
        with pytest.raises(WaltzError, match="cannot apply transaction 80"):
            second.apply_transactions(_batch(80, 5))
        with pytest.raises(WaltzError, match="consecutive"):
            second.apply_transactions([*_batch(70, 2), *_batch(73, 1)])
        assert _ids(first.query_all("SELECT transaction_id FROM journal ORDER BY 1")) == list(range(70))
        assert first.get_client_high_water_mark(0) == 69


@pytest.mark.callback_modes("thread")  # applies fetch the other client's data
def test_postgres_instances_catch_up_in_batches_exactly_once(postgres_dsn: str) -> None:
    server = MockServer(2)
    server.feed_batch_size = 7
    with WaltzClient(MemoryCallbacks(), FAST, driver=server) as writer:
        futures = [writer.submit(Ctx(b"w%d" % i, partition=i)) for i in range(60)]
        assert all(f.result(timeout=30) for f in futures)
    with PgJournal(postgres_dsn) as a_db, PgJournal(postgres_dsn) as b_db, \
            WaltzClient(a_db, FAST, driver=server) as a, WaltzClient(b_db, FAST, driver=server) as b:
        a.wait_mounted()
        b.wait_mounted()
        batches = a.stats.apply_batches + b.stats.apply_batches
        rows = a_db.query_all("SELECT partition_id, transaction_id, data FROM journal ORDER BY 1, 2")
    assert rows == [(p, r.transaction_id, r.data) for p in (0, 1) for r in server.records(p)] and len(rows) == 60
    assert batches >= 2  # a call per partition at least (feed batches that wait together are applied as one)
    # (how many each instance skipped depends on the race: an instance that mounts after the other applied
    # some starts at the database's mark, and never sees those)


@pytest.mark.callback_modes("thread")  # the helper needs the callback thread (it waits for the loop)
def test_the_async_helper_applies_batches_exactly_once_with_another_instance(postgres_dsn: str) -> None:
    server = MockServer(2)
    server.feed_batch_size = 7

    async def scenario() -> tuple[list[tuple[int, int, bytes]], int, int]:
        async with AsyncJournal(postgres_dsn) as a_db, AsyncJournal(postgres_dsn) as b_db, \
                AsyncWaltzClient(a_db, FAST, driver=server) as a, AsyncWaltzClient(b_db, FAST, driver=server) as b:
            await a.wait_mounted()
            await b.wait_mounted()
            futures = [await a.submit(Ctx(b"a%d" % i, partition=i)) for i in range(30)]
            futures += [await b.submit(Ctx(b"b%d" % i, partition=i)) for i in range(30)]
            assert all(await asyncio.gather(*futures))
            for c in (a, b):
                for p in (0, 1):
                    while c.client_high_water_mark(p) < server.high_water_mark(p):
                        await asyncio.sleep(0.01)
            rows = await a_db.query_all("SELECT partition_id, transaction_id, data FROM journal ORDER BY 1, 2")
            return rows, a_db.skipped + b_db.skipped, a.stats.apply_batches

    rows, skipped, batches = asyncio.run(asyncio.wait_for(scenario(), 60))
    assert rows == [(p, r.transaction_id, r.data) for p in (0, 1) for r in server.records(p)] and len(rows) == 60
    assert skipped == 60 and batches > 0  # each transaction reached both instances; one applied it


@pytest.mark.callback_modes("thread")
def test_execute_reads_what_the_async_helper_applied_with_query_all_blocking(postgres_dsn: str) -> None:
    server = MockServer(1)
    seen: list[tuple[int, int]] = []

    async def scenario() -> None:
        async with AsyncJournal(postgres_dsn) as db, AsyncWaltzClient(db, FAST, driver=server) as client:
            await client.wait_mounted()

            def read(builder: TransactionBuilder) -> bool:  # on the callback thread, as execute() is
                [(count,)] = db.query_all_blocking("SELECT count(*) FROM journal WHERE partition_id = %s", 0)
                seen.append((count, builder.client_high_water_mark))
                return True

            for i in range(5):
                assert await client.submit_and_wait(Ctx(b"r%d" % i, result=read))

    asyncio.run(asyncio.wait_for(scenario(), 60))
    # every execute() saw exactly what the high-water mark its append carries says was applied
    assert seen == [(i, i - 1) for i in range(5)]


class AsyncFailing(AsyncJournal):
    """AsyncJournal whose apply raises on fail_at (once), or writes a row the database refuses on clash_at (once)."""

    fail_at: int | None = None
    clash_at: int | None = None

    async def create_schema(self, connection: AsyncPgGuardedConnection) -> None:
        await super().create_schema(connection)
        await connection.execute("CREATE TABLE IF NOT EXISTS once (id INTEGER PRIMARY KEY)")
        await connection.execute("INSERT INTO once VALUES (1) ON CONFLICT DO NOTHING")

    async def apply(self, transaction: Transaction, connection: AsyncPgGuardedConnection) -> None:
        await super().apply(transaction, connection)
        if transaction.transaction_id == self.fail_at:
            self.fail_at = None
            raise RuntimeError("constraint violated")
        if transaction.transaction_id == self.clash_at:
            self.clash_at = None
            await connection.execute("INSERT INTO once VALUES (1)")  # refused by the server, not by Python


class AsyncCopyJournal(AsyncJournal):
    """A batch written with COPY, which psycopg refuses in pipeline mode: the helper must not pipeline it."""

    async def apply_batch(self, transactions: Sequence[Transaction], connection: AsyncPgGuardedConnection) -> None:
        async with connection.cursor().copy("COPY journal (partition_id, transaction_id, data) FROM STDIN") as copy:
            for transaction in transactions:
                await copy.write_row((transaction.partition_id, transaction.transaction_id, transaction.data()))


@pytest.mark.callback_modes("thread")
def test_the_async_helper_pipelines_a_batch_all_or_nothing_and_copies_outside_the_pipeline(postgres_dsn: str) -> None:
    """The batch's statements go in pipeline mode (BEGIN with the lock, apply() for each, the mark with COMMIT):
    a batch whose apply raises, or whose statement the server refuses, leaves nothing and the mark where it was, and
    the connection applies the next batch; an apply_batch of the application's own (COPY) runs outside it."""
    results: dict[str, object] = {}

    async def scenario() -> None:
        async with AsyncFailing(postgres_dsn) as db, AsyncCopyJournal(postgres_dsn, table="copy_mark") as copying:
            def callback_thread() -> None:
                db.get_client_high_water_mark(0)
                db.apply_transactions(_batch(0, 5))
                db.fail_at = 7
                with pytest.raises(RuntimeError, match="constraint violated"):
                    db.apply_transactions(_batch(5, 5))
                results["after raise"] = db.get_client_high_water_mark(0)
                db.clash_at = 8
                with pytest.raises(psycopg.errors.UniqueViolation):
                    db.apply_transactions(_batch(5, 5))
                results["after clash"] = db.get_client_high_water_mark(0)
                db.apply_transactions(_batch(5, 5))
                results["rows"] = _ids(db.query_all_blocking("SELECT transaction_id FROM journal ORDER BY 1"))
                results["mark"] = db.get_client_high_water_mark(0)
                copying.apply_transactions(_batch(0, 3))  # its own mark table: from 0
                results["copied mark"] = copying.get_client_high_water_mark(0)

            await asyncio.to_thread(callback_thread)

    asyncio.run(asyncio.wait_for(scenario(), 60))
    assert results["after raise"] == 4 and results["after clash"] == 4
    assert results["rows"] == list(range(10)) and results["mark"] == 9 and results["copied mark"] == 2


class AsyncSavepoints(AsyncJournal):
    """Each apply() tries a write that fails inside a savepoint of its own, then writes its row."""

    async def apply(self, transaction: Transaction, connection: AsyncPgGuardedConnection) -> None:
        with contextlib.suppress(psycopg.errors.UniqueViolation):
            async with connection.transaction():
                await connection.execute("INSERT INTO once VALUES (1)")  # there already: this savepoint rolls back
        await super().apply(transaction, connection)

    async def create_schema(self, connection: AsyncPgGuardedConnection) -> None:
        await super().create_schema(connection)
        await connection.execute("CREATE TABLE IF NOT EXISTS once (id INTEGER PRIMARY KEY)")
        await connection.execute("INSERT INTO once VALUES (1) ON CONFLICT DO NOTHING")


@pytest.mark.callback_modes("thread")
def test_a_savepoint_that_fails_inside_a_pipelined_batch_leaves_the_rest_of_the_batch(postgres_dsn: str) -> None:
    async def scenario() -> tuple[list[int], int]:
        async with AsyncSavepoints(postgres_dsn) as db:
            def callback_thread() -> tuple[list[int], int]:
                db.apply_transactions(_batch(0, 3))
                return (_ids(db.query_all_blocking("SELECT transaction_id FROM journal ORDER BY 1")),
                        db.get_client_high_water_mark(0))

            return await asyncio.to_thread(callback_thread)

    assert asyncio.run(asyncio.wait_for(scenario(), 60)) == ([0, 1, 2], 2)


@pytest.mark.callback_modes("thread")
def test_query_all_blocking_does_not_wait_for_the_loop(postgres_dsn: str) -> None:
    """execute() reads on a connection of the callback thread's own: while the loop is busy (here blocked until
    the read is done), the read goes on. Through the loop it would wait for the loop, which waits for it."""
    async def scenario() -> list[str]:
        async with AsyncJournal(postgres_dsn) as db:
            read = threading.Event()
            order: list[str] = []

            def execute() -> None:
                order.append(f"read {db.query_all_blocking('SELECT count(*) FROM journal')}")
                read.set()

            thread = threading.Thread(target=execute)
            thread.start()
            order.append(f"loop free: read before {read.wait(timeout=10)}")  # blocks the loop meanwhile
            await asyncio.to_thread(thread.join, 30)
            with pytest.raises(WaltzError, match="await query_all"):
                db.query_all_blocking("SELECT 1")  # on the loop itself
            return order

    assert asyncio.run(asyncio.wait_for(scenario(), 60)) == ["read [(0,)]", "loop free: read before True"]


@pytest.mark.callback_modes("loop")
def test_the_async_helper_refuses_to_run_on_the_loop_it_waits_for(postgres_dsn: str) -> None:
    async def scenario() -> None:
        async with AsyncJournal(postgres_dsn) as db:
            with pytest.raises(WaltzError, match="needs the client's callback thread"):
                db.get_client_high_water_mark(0)  # here, on the loop: as with client.callbackThread false

    asyncio.run(scenario())
    closed = AsyncJournal(postgres_dsn)
    with pytest.raises(WaltzError, match="is not open"):
        closed.get_client_high_water_mark(0)


BATCH_HOLDER = """
import sys, time
from tests.component.client.test_postgres_batches import PgJournal, _batch

class Stuck(PgJournal):
    use_pipeline = False  # each row sent as apply() runs: two rows written, uncommitted, when it stops
    def apply(self, transaction, connection):
        super().apply(transaction, connection)
        if transaction.transaction_id == 2:
            print("holding", flush=True)  # mid batch: 0..2 written, the partition's row locked, nothing committed
            time.sleep(600)

Stuck(sys.argv[1]).apply_transactions(_batch(0, 5))
"""


@pytest.mark.callback_modes("thread")
def test_an_instance_killed_mid_batch_leaves_none_of_it_and_another_applies_it_once(postgres_dsn: str) -> None:
    with PgJournal(postgres_dsn) as survivor:
        survivor.get_client_high_water_mark(0)
        holder = subprocess.Popen([sys.executable, "-c", BATCH_HOLDER, postgres_dsn], stdout=subprocess.PIPE,
                                  text=True, cwd=Path(__file__).resolve().parents[3])
        try:
            assert holder.stdout is not None and holder.stdout.readline().strip() == "holding"
            holder.kill()  # kill -9 inside the batch's database transaction
            holder.wait(30)
            survivor.apply_transactions(_batch(0, 5))
        finally:
            if holder.poll() is None:
                holder.kill()
                holder.wait(30)
        assert _ids(survivor.query_all("SELECT transaction_id FROM journal ORDER BY 1")) == list(range(5))
        assert survivor.skipped == 0 and survivor.get_client_high_water_mark(0) == 4
