"""AsyncPostgresClientCallbacks: PostgresClientCallbacks for asyncio applications (psycopg's AsyncConnection).

Needs psycopg 3: the `postgres` extra (`pip install -e '.[postgres]'` in a checkout; docs/client-guide.md, Installing).

How it runs: the client calls its callbacks on its callback thread (client.callbackThread, the default), as
plain functions. This helper's are coroutines run on the application's event loop, the one it was opened on
(`async with AsyncPostgresClientCallbacks(...)`), which is the loop AsyncWaltzClient runs on: the callback thread
hands each batch to that loop and waits for it, so batches are still applied one at a time, in order, while the
loop goes on serving the client and the application. The data of the batch's transactions is read on the
callback thread first (Transaction.data() blocks, which a coroutine on the loop must not), so apply() finds it
loaded. With client.callbackThread false the callbacks would run on the loop itself and wait for it: the helper
refuses that with a clear error.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any, Self, TypeVar

import psycopg

from waltz_client.api import Transaction
from waltz_client.apply_batch import (
    BatchApplyCallbacks,
    check_table_name,
    helper_default,
    is_helper_default,
    still_to_apply,
)
from waltz_client.errors import WaltzError
from waltz_client.postgres_callbacks import (
    DatabaseUnavailableError,
    PgStatements,
    Retry,
    ThreadConnections,
    connect_blocking,
    describe,
    retrying,
)
from waltz_client.sqlite_callbacks import ForbiddenCallError

R = TypeVar("R")


class AsyncPgGuardedConnection:
    """The connection apply() gets: statements (and savepoints) go through, commit and rollback do not."""

    def __init__(self, connection: psycopg.AsyncConnection[Any]) -> None:
        self._connection = connection

    async def execute(self, sql: Any, parameters: Any = None) -> psycopg.AsyncCursor[Any]:
        return await self._connection.execute(sql, parameters)

    def cursor(self) -> psycopg.AsyncCursor[Any]:
        return self._connection.cursor()

    def transaction(self) -> Any:
        """A savepoint inside the helper's transaction (`async with connection.transaction():`)."""
        return self._connection.transaction()

    def pipeline(self) -> AbstractAsyncContextManager[Any]:
        """psycopg's pipeline mode (statements sent without waiting for answers) where libpq has it, else nothing."""
        return _pipeline(self._connection)

    async def commit(self) -> None:
        raise ForbiddenCallError("apply() must not commit: the helper commits with the high-water mark")

    async def rollback(self) -> None:
        raise ForbiddenCallError("apply() must not roll back: raise an exception instead")


def _pipeline(conn: psycopg.AsyncConnection[Any]) -> AbstractAsyncContextManager[Any]:
    """The connection's pipeline mode where libpq has it (14 and later), else nothing."""
    return conn.pipeline() if psycopg.Pipeline.is_supported() else contextlib.nullcontext()


class AsyncPostgresClientCallbacks(BatchApplyCallbacks):
    """PostgresClientCallbacks' exactly-once apply (a batch and the partition's high-water mark in one database
    transaction, the partition's row locked FOR UPDATE, transactions up to the stored mark skipped), with
    coroutines: subclasses implement `async def apply(transaction, connection)` or `apply_batch` (or both) and
    `async def create_schema(connection)`. Use it as

        async with AsyncPostgresClientCallbacks(dsn) as callbacks:      # connects, creates the schema
            async with AsyncWaltzClient(callbacks, config) as client:   # same loop, callback thread on
                ...

    Its own connection applies the batches (one at a time); `query_all` reads on a second one, so an
    application's reads never land inside an apply's transaction. A lost connection, a deadlock or a
    serialization failure is retried as in PostgresClientCallbacks (reconnect_timeout, then
    DatabaseUnavailableError, which the client reports and retries).

    A log can hold other applications' transactions (a development log kept by `waltz dev --data` does): tag
    yours (`builder.set_header(MINE)` in execute()) and have `async def apply()` return at once for any other
    header; the helper moves the high-water mark past the whole batch all the same (docs/applications.md, A log
    shared with other applications)."""

    use_pipeline = True
    """apply_batch runs apply() in pipeline mode; False for an apply() that uses COPY (refused in that mode)."""

    def __init__(self, conninfo: str, table: str = "waltz_client_high_water_mark", *,
                 connect_timeout: float = 10.0, reconnect_timeout: float = 30.0) -> None:
        self.conninfo = conninfo
        self.table = check_table_name(table)
        self.sql = PgStatements(table)
        self.connect_timeout = connect_timeout
        self.reconnect_timeout = reconnect_timeout
        self.where = describe(conninfo)
        self.skipped = 0  # transactions another instance had applied already
        self._loop_reconnects = 0  # the loop's connections opened again after one broke
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: threading.Thread | None = None
        self._apply_conn: psycopg.AsyncConnection[Any] | None = None
        self._query_conn: psycopg.AsyncConnection[Any] | None = None
        self._blocking = ThreadConnections(  # query_all_blocking's connections
            lambda: connect_blocking(self.conninfo, self.connect_timeout, self.where))

    async def __aenter__(self) -> Self:
        await self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def open(self) -> None:
        """Connect on the running loop (the one the client must run on) and create the schema."""
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.current_thread()
        conn = await self._connection("_apply_conn")
        async with conn.transaction():
            # two instances starting together must not race on CREATE TABLE IF NOT EXISTS
            await conn.execute(self.sql.schema_lock, (self.sql.schema_lock_key,))
            await conn.execute(self.sql.create)
            await self.create_schema(AsyncPgGuardedConnection(conn))

    async def close(self) -> None:
        """Close the helper's connections."""
        for name in ("_apply_conn", "_query_conn"):
            conn = getattr(self, name)
            setattr(self, name, None)
            if conn is not None:
                await conn.close()
        self._blocking.close_all()

    async def create_schema(self, connection: AsyncPgGuardedConnection) -> None:
        """Create the application's tables (called by open(), in the schema transaction)."""

    @helper_default
    async def apply(self, transaction: Transaction, connection: AsyncPgGuardedConnection) -> None:
        """Make the transaction's changes (its data() is loaded); the helper commits them with the high-water mark.
        Implement this, or apply_batch (then this is not called)."""
        raise NotImplementedError(f"{type(self).__name__} implements neither apply() nor apply_batch()")

    @helper_default
    async def apply_batch(self, transactions: Sequence[Transaction], connection: AsyncPgGuardedConnection) -> None:
        """Make a batch's changes: apply() for each, in psycopg's pipeline mode unless `use_pipeline` is False
        (statements go without waiting for each answer; an apply() that reads a result waits for it then).
        Override it to write a batch at once (executemany, COPY)."""
        async with connection.pipeline() if self.use_pipeline else contextlib.nullcontext():
            for transaction in transactions:
                await self.apply(transaction, connection)

    # ---- what the client calls, on its callback thread --------------------------------------------

    def get_client_high_water_mark(self, partition_id: int) -> int:
        async def read(conn: psycopg.AsyncConnection[Any]) -> int:
            await conn.execute(self.sql.insert, (partition_id,))
            cursor = await conn.execute(self.sql.read, (partition_id,))
            row = await cursor.fetchone()
            return -1 if row is None else int(row[0])

        return self._on_loop(self._retrying(f"reading partition {partition_id}'s high-water mark", "_apply_conn",
                                            read))

    def _apply_in_one_transaction(self, transactions: list[Transaction], what: str) -> int:
        """The batch's data read here (it blocks), then the batch applied on the loop in one database transaction."""
        for transaction in transactions:
            transaction.data()
        return self._on_loop(self._retrying(what, "_apply_conn", lambda conn: self._apply_once(conn, transactions)))

    def query_all_blocking(self, sql: Any, *parameters: Any) -> list[Any]:
        """Rows of a read-only query from a thread that is not the loop's: the client's callback thread, in
        execute() (not a coroutine). It runs on a plain connection of the calling thread's own, not through the
        loop (a hop to the loop and back cost more than the query), and sees every batch applied before it (they
        commit before their apply returns)."""
        if threading.current_thread() is self._loop_thread:
            raise WaltzError("query_all_blocking waits for the database: on the event loop, await query_all()")
        return retrying("a query", self.where, self.reconnect_timeout, self._blocking.get,
                        lambda conn: list(conn.execute(sql, parameters or None).fetchall()))

    @property
    def reconnects(self) -> int:
        """Connections opened again after one broke (the loop's and query_all_blocking's)."""
        return self._loop_reconnects + self._blocking.reconnects

    # ---- on the loop ---------------------------------------------------------------------------

    async def query_all(self, sql: Any, *parameters: Any) -> list[Any]:
        """Rows of a read-only query, on the helper's query connection (for applications and tests)."""
        async def query(conn: psycopg.AsyncConnection[Any]) -> list[Any]:
            cursor = await conn.execute(sql, parameters or None)
            return list(await cursor.fetchall())

        return await self._retrying("a query", "_query_conn", query)

    async def _apply_once(self, conn: psycopg.AsyncConnection[Any], transactions: list[Transaction]) -> int:
        """Apply what the database has not yet; how many it had (another instance applied them). The helper's
        own statements go in two round trips (BEGIN with the lock, the mark with COMMIT), whatever apply_batch
        does between them (COPY included)."""
        pid, sql = transactions[0].partition_id, self.sql
        try:
            async with _pipeline(conn):
                await conn.execute("BEGIN")
                row = await (await conn.execute(sql.lock, (pid,))).fetchone()
            if row is None:  # no row to lock yet (no get_client_high_water_mark ran): make one, then lock it
                await conn.execute(sql.insert, (pid,))
                row = await (await conn.execute(sql.lock, (pid,))).fetchone()
            assert row is not None
            todo = still_to_apply(transactions, int(row[0]))
            guarded = AsyncPgGuardedConnection(conn)
            pipelined = self.use_pipeline and is_helper_default(type(self), "apply_batch")
            if todo and not pipelined:
                await self.apply_batch(todo, guarded)  # the application's own: it may COPY, refused in a pipeline
            async with _pipeline(conn):
                if todo:
                    if pipelined:  # apply() for each, and the mark with the commit: the last round trip
                        for transaction in todo:
                            await self.apply(transaction, guarded)
                    await conn.execute(sql.update, (todo[-1].transaction_id, pid))
                await conn.execute("COMMIT")
            return len(transactions) - len(todo)
        except BaseException:
            if not conn.closed and not conn.broken:
                with contextlib.suppress(psycopg.Error):
                    await conn.execute("ROLLBACK")
            raise

    async def _retrying(self, what: str, slot: str,
                        work: Callable[[psycopg.AsyncConnection[Any]], Awaitable[R]]) -> R:
        retry = Retry(what, self.where, self.reconnect_timeout)
        while True:
            conn: psycopg.AsyncConnection[Any] | None = None
            try:
                conn = await self._connection(slot)
                return await work(conn)
            except (psycopg.OperationalError, DatabaseUnavailableError) as exc:
                await asyncio.sleep(retry.delay_after(exc, conn is None or conn.closed or conn.broken))

    async def _connection(self, slot: str) -> psycopg.AsyncConnection[Any]:
        """The connection in that slot, (re)opened if it has none or it broke (DatabaseUnavailableError)."""
        conn: psycopg.AsyncConnection[Any] | None = getattr(self, slot)
        if conn is not None and not conn.closed and not conn.broken:
            return conn
        if conn is not None:
            self._loop_reconnects += 1
            try:
                await conn.close()
            except psycopg.Error:
                pass
        try:
            conn = await psycopg.AsyncConnection.connect(self.conninfo, autocommit=True,
                                                        connect_timeout=max(1, round(self.connect_timeout)))
        except psycopg.OperationalError as exc:
            raise DatabaseUnavailableError(f"cannot connect to PostgreSQL at {self.where}: "
                                           f"{str(exc).strip() or type(exc).__name__}") from exc
        setattr(self, slot, conn)
        return conn

    def _on_loop(self, coro: Coroutine[Any, Any, R]) -> R:
        """Run coro on the helper's loop from the client's callback thread, and wait for it."""
        loop = self._loop
        if loop is None or loop.is_closed():
            coro.close()
            raise WaltzError("AsyncPostgresClientCallbacks is not open: `async with` it (or await open()) "
                             "on the loop the client runs on")
        if threading.current_thread() is self._loop_thread:
            coro.close()
            raise WaltzError("AsyncPostgresClientCallbacks runs its coroutines on the event loop and waits for "
                             "them: it needs the client's callback thread (client.callbackThread: true)")
        return asyncio.run_coroutine_threadsafe(coro, loop).result()
