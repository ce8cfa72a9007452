"""PostgresClientCallbacks: apply the feed exactly once into a PostgreSQL database shared by instances.

Needs psycopg 3: the `postgres` extra (`pip install -e '.[postgres]'` in a checkout; docs/client-guide.md, Installing).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Any, Self, TypeVar

import psycopg
from psycopg import errors as pg_errors
from psycopg.conninfo import conninfo_to_dict

from waltz_client.api import Transaction
from waltz_client.apply_batch import BatchApplyCallbacks, check_table_name, helper_default, still_to_apply
from waltz_client.errors import WaltzError
from waltz_client.sqlite_callbacks import ForbiddenCallError

log = logging.getLogger(__name__)
R = TypeVar("R")


class DatabaseUnavailableError(WaltzError):
    """The PostgreSQL server could not be reached (or the connection kept failing) in time."""


_TRANSIENT = (DatabaseUnavailableError, pg_errors.SerializationFailure, pg_errors.DeadlockDetected)


class Retry:
    """The helpers' policy for a database transaction that failed: again after a lost connection, a deadlock or a
    serialization failure, with backoff (50 ms doubling to 2 s), until reconnect_timeout has passed."""

    def __init__(self, what: str, where: str, reconnect_timeout: float) -> None:
        self.what, self.where, self.reconnect_timeout = what, where, reconnect_timeout
        self.deadline = time.monotonic() + reconnect_timeout
        self.delay = 0.05

    def delay_after(self, exc: BaseException, connection_lost: bool) -> float:
        """Seconds to wait before trying again; raises exc (not transient) or DatabaseUnavailableError (too long)."""
        if not (isinstance(exc, _TRANSIENT) or connection_lost):
            raise exc
        delay = self.delay
        text = str(exc).strip() or type(exc).__name__
        if time.monotonic() + delay > self.deadline:
            raise DatabaseUnavailableError(f"{self.what}: PostgreSQL at {self.where} kept failing for "
                                           f"{self.reconnect_timeout:g} s: {text}") from exc
        log.warning("%s: %s; trying again in %.2f s", self.what, text, delay)
        self.delay = min(delay * 2, 2.0)
        return delay


def connect_blocking(conninfo: str, connect_timeout: float, where: str) -> psycopg.Connection[Any]:
    """A plain autocommit connection (the helpers open the transactions); DatabaseUnavailableError if it fails."""
    try:
        return psycopg.connect(conninfo, autocommit=True, connect_timeout=max(1, round(connect_timeout)))
    except psycopg.OperationalError as exc:
        raise DatabaseUnavailableError(f"cannot connect to PostgreSQL at {where}: "
                                       f"{str(exc).strip() or type(exc).__name__}") from exc


class ThreadConnections:
    """A connection per calling thread: get() gives the calling thread's, opened with `opener` (connect_blocking, with
    the helper's settings as they are then) if it has none or it broke; close_all() closes every one opened."""

    def __init__(self, opener: Callable[[], psycopg.Connection[Any]]) -> None:
        self._open = opener
        self.reconnects = 0  # connections opened again after the calling thread's broke
        self._local = threading.local()
        self._opened: list[psycopg.Connection[Any]] = []
        self._guard = threading.Lock()

    def get(self) -> psycopg.Connection[Any]:
        conn: psycopg.Connection[Any] | None = getattr(self._local, "connection", None)
        if conn is not None and not conn.closed and not conn.broken:
            return conn
        if conn is not None:
            self._forget(conn)
            self.reconnects += 1
        conn = self._open()
        self._local.connection = conn
        with self._guard:
            self._opened.append(conn)
        return conn

    def _forget(self, conn: psycopg.Connection[Any]) -> None:
        with self._guard:
            if conn in self._opened:
                self._opened.remove(conn)
        try:
            conn.close()
        except psycopg.Error:
            pass

    def close_all(self) -> None:
        with self._guard:
            opened, self._opened = self._opened, []
        for conn in opened:
            conn.close()
        self._local = threading.local()


def retrying(what: str, where: str, reconnect_timeout: float, connection: Callable[[], psycopg.Connection[Any]],
             work: Callable[[psycopg.Connection[Any]], R]) -> R:
    """work(connection()), again after a lost connection, a deadlock or a serialization failure (Retry's policy),
    until reconnect_timeout has passed."""
    retry = Retry(what, where, reconnect_timeout)
    while True:
        conn: psycopg.Connection[Any] | None = None
        try:
            conn = connection()
            return work(conn)
        except (psycopg.OperationalError, DatabaseUnavailableError) as exc:
            time.sleep(retry.delay_after(exc, conn is None or conn.closed or conn.broken))


class PgGuardedConnection:
    """The connection apply() gets: statements (and savepoints) go through, commit and rollback do not."""

    def __init__(self, connection: psycopg.Connection[Any]) -> None:
        self._connection = connection

    def execute(self, sql: Any, parameters: Any = None) -> psycopg.Cursor[Any]:
        return self._connection.execute(sql, parameters)

    def cursor(self) -> psycopg.Cursor[Any]:
        return self._connection.cursor()

    def transaction(self) -> Any:
        """A savepoint inside the helper's transaction (psycopg's nested transaction block)."""
        return self._connection.transaction()

    def pipeline(self) -> AbstractContextManager[Any]:
        """psycopg's pipeline mode (statements sent without waiting for answers) where libpq has it, else nothing."""
        return _pipeline(self._connection)

    def commit(self) -> None:
        raise ForbiddenCallError("apply() must not commit: the helper commits with the high-water mark")

    def rollback(self) -> None:
        raise ForbiddenCallError("apply() must not roll back: raise an exception instead")


def _pipeline(conn: psycopg.Connection[Any]) -> AbstractContextManager[Any]:
    """The connection's pipeline mode where libpq has it (14 and later), else nothing."""
    return conn.pipeline() if psycopg.Pipeline.is_supported() else nullcontext()


def describe(conninfo: str) -> str:
    """Where a connection string points, for messages: user@host:port/dbname, never the password."""
    try:
        parts = conninfo_to_dict(conninfo)
    except psycopg.ProgrammingError:
        return "(an unparsable connection string)"
    host, port = parts.get("host") or parts.get("hostaddr") or "localhost", parts.get("port") or "5432"
    user = f"{parts['user']}@" if parts.get("user") else ""
    return f"{user}{host}:{port}/{parts.get('dbname') or '(default database)'}"


class PgStatements:
    """The SQL of the high-water-mark table both PostgreSQL helpers run (%s parameters: the partition id first,
    then, in `update`, the new mark first)."""

    def __init__(self, table: str) -> None:
        self.create = (f"CREATE TABLE IF NOT EXISTS {table} "
                       "(partition_id INTEGER PRIMARY KEY, high_water_mark BIGINT NOT NULL)")
        self.insert = (f"INSERT INTO {table} (partition_id, high_water_mark) VALUES (%s, -1) "
                       "ON CONFLICT (partition_id) DO NOTHING")
        self.read = f"SELECT high_water_mark FROM {table} WHERE partition_id = %s"
        self.lock = self.read + " FOR UPDATE"
        self.update = f"UPDATE {table} SET high_water_mark = %s WHERE partition_id = %s"
        self.schema_lock = "SELECT pg_advisory_xact_lock(hashtext(%s))"  # with `waltz schema <table>`
        self.schema_lock_key = f"waltz schema {table}"


class PostgresClientCallbacks(BatchApplyCallbacks):
    """Applies each batch of transactions the feed brings (apply_transactions: up to a feed message's
    worth, one or a few in steady state, hundreds while catching up) and moves the partition's
    high-water mark in ONE database transaction, so that any number of application instances sharing
    the database apply every transaction exactly once. Each batch locks the partition's row of the
    high-water-mark table:

        SELECT high_water_mark FROM <table> WHERE partition_id = %s FOR UPDATE

    An instance that finds the mark at a transaction's id or beyond skips it (another instance
    applied it; `skipped` counts these); it applies the rest of the batch and moves the mark to the
    batch's last id, then commits; the others wait on the row lock meanwhile. Subclasses implement
    apply(transaction, connection) with the connection they are given (no commit/rollback), or
    apply_batch(transactions, connection) to write a batch at once (or both), and create_schema(connection)
    for their tables. `with PostgresClientCallbacks(...) as callbacks:` closes its connections.

    A lost connection (server restart, failover, pg_terminate_backend), a deadlock or a serialization
    failure rolls the whole database transaction back; the helper reconnects and tries again, with
    backoff, for up to reconnect_timeout seconds, then raises DatabaseUnavailableError (the client
    then retries the apply itself, with its own backoff, and reports it to uncaught_exception). Trying
    again is safe: the high-water mark tells whether a commit whose answer was lost went through.
    Connections are per thread (autocommit, the helper opens the transactions); `connect()` gives the
    calling thread's (for reads in execute()).

    A log can hold other applications' transactions (a development log kept by `waltz dev --data` does): tag
    yours (`builder.set_header(MINE)` in execute()) and have apply() (or apply_batch, filtering) skip any other
    header. The helper moves the high-water mark past the whole batch all the same, so they are skipped once;
    raising instead would retry them forever (docs/applications.md, A log shared with other applications).
    """

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
        self._threads = ThreadConnections(lambda: connect_blocking(self.conninfo, self.connect_timeout, self.where))
        self.skipped = 0  # transactions another instance had applied already
        conn = self.connect()
        with conn.transaction():
            # two instances starting together must not race on CREATE TABLE IF NOT EXISTS
            conn.execute(self.sql.schema_lock, (self.sql.schema_lock_key,))
            conn.execute(self.sql.create)
            self.create_schema(PgGuardedConnection(conn))

    def connect(self) -> psycopg.Connection[Any]:
        """This thread's connection, (re)opened if it has none or it broke (DatabaseUnavailableError)."""
        return self._threads.get()

    @property
    def reconnects(self) -> int:
        """Connections opened again after one broke."""
        return self._threads.reconnects

    def create_schema(self, connection: PgGuardedConnection) -> None:
        """Create the application's tables (called at construction, in the schema transaction)."""

    @helper_default
    def apply(self, transaction: Transaction, connection: PgGuardedConnection) -> None:
        """Make the transaction's changes; the helper commits them with the high-water mark. Implement this, or
        apply_batch (then this is not called)."""
        raise NotImplementedError(f"{type(self).__name__} implements neither apply() nor apply_batch()")

    def get_client_high_water_mark(self, partition_id: int) -> int:
        def read(conn: psycopg.Connection[Any]) -> int:
            conn.execute(self.sql.insert, (partition_id,))
            return self._stored_high_water_mark(conn, partition_id)

        return self._retrying(f"reading partition {partition_id}'s high-water mark", read)

    @helper_default
    def apply_batch(self, transactions: Sequence[Transaction], connection: PgGuardedConnection) -> None:
        """Make a batch's changes (consecutive transactions, in id order): apply() for each, in psycopg's
        pipeline mode unless `use_pipeline` is False (statements go without waiting for each answer: a round trip
        per statement was most of a batch's time; an apply() that reads a result waits for it then). Override
        it to write a batch with fewer statements (executemany, COPY); the helper commits it with the mark."""
        with connection.pipeline() if self.use_pipeline else nullcontext():
            for transaction in transactions:
                self.apply(transaction, connection)

    def _apply_in_one_transaction(self, transactions: list[Transaction], what: str) -> int:
        return self._retrying(what, lambda conn: self._apply_once(conn, transactions))

    def _apply_once(self, conn: psycopg.Connection[Any], transactions: list[Transaction]) -> int:
        """Apply what the database has not yet; how many it had (another instance applied them)."""
        pid, sql = transactions[0].partition_id, self.sql
        with conn.transaction():
            row = conn.execute(sql.lock, (pid,)).fetchone()
            if row is None:  # no row to lock yet (no get_client_high_water_mark ran): make one, then lock it
                conn.execute(sql.insert, (pid,))
                row = conn.execute(sql.lock, (pid,)).fetchone()
            assert row is not None
            todo = still_to_apply(transactions, int(row[0]))
            if todo:
                self.apply_batch(todo, PgGuardedConnection(conn))
                conn.execute(sql.update, (todo[-1].transaction_id, pid))
            return len(transactions) - len(todo)

    def _retrying(self, what: str, work: Callable[[psycopg.Connection[Any]], R]) -> R:
        """work(connection) in a fresh database transaction, again after a lost connection, a deadlock or a
        serialization failure, until reconnect_timeout has passed."""
        return retrying(what, self.where, self.reconnect_timeout, self.connect, work)

    def query_all(self, sql: Any, *parameters: Any) -> list[Any]:
        """Rows of a read-only query on this thread's connection (for applications and tests)."""
        return self._retrying("a query", lambda conn: list(conn.execute(sql, parameters or None).fetchall()))

    def _stored_high_water_mark(self, conn: psycopg.Connection[Any], partition_id: int) -> int:
        row = conn.execute(self.sql.read, (partition_id,)).fetchone()
        return -1 if row is None else int(row[0])

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close every connection this object opened (`with` does it on leaving)."""
        self._threads.close_all()
