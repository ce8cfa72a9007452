"""SqliteClientCallbacks: apply the feed exactly once into a SQLite database shared by instances."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Self

from waltz_client.api import Transaction
from waltz_client.apply_batch import BatchApplyCallbacks, check_table_name, helper_default, still_to_apply
from waltz_client.errors import WaltzError


class ForbiddenCallError(WaltzError):
    """apply() tried to end or reshape the transaction the helper runs it in."""


class GuardedConnection:
    """The connection apply() gets: statements go through, commit and rollback do not."""

    def __init__(self, connection: sqlite3.Connection) -> None:
        self._connection = connection

    def execute(self, sql: str, parameters: Any = ()) -> sqlite3.Cursor:
        return self._connection.execute(sql, parameters)

    def executemany(self, sql: str, parameters: Any) -> sqlite3.Cursor:
        return self._connection.executemany(sql, parameters)

    def cursor(self) -> sqlite3.Cursor:
        return self._connection.cursor()

    def commit(self) -> None:
        raise ForbiddenCallError("apply() must not commit: the helper commits with the high-water mark")

    def rollback(self) -> None:
        raise ForbiddenCallError("apply() must not roll back: raise an exception instead")

    def executescript(self, script: str) -> None:
        raise ForbiddenCallError("executescript commits implicitly; use execute()")


class SqliteClientCallbacks(BatchApplyCallbacks):
    """Applies each batch of transactions the feed brings (apply_transactions) and moves the
    partition's high-water mark in ONE database transaction, so that several application instances
    sharing the database apply every transaction exactly once: under BEGIN IMMEDIATE (the database's
    write lock) an instance reads the mark, skips the transactions up to it (another instance applied
    them; `skipped` counts these), applies the rest, moves the mark to the batch's last id and
    commits. Subclasses implement apply(transaction, connection) with the connection they are given
    (no commit/rollback), or apply_batch(transactions, connection) to write a batch at once, or both.
    Connections are per thread; `connect()` gives the calling thread's (for reads in execute).

    A log can hold other applications' transactions (a development log kept by `waltz dev --data` does): tag
    yours (`builder.set_header(MINE)` in execute()) and have apply() return at once for any other header. The
    helper moves the high-water mark past the whole batch all the same, so they are skipped once and never come
    back; raising instead would retry them forever (docs/applications.md, A log shared with other applications).
    """

    def __init__(self, database: str | Path, table: str = "waltz_client_high_water_mark") -> None:
        if str(database) == ":memory:":
            raise ValueError("use a database file: every thread's :memory: connection is a separate database")
        self.database = str(database)
        self.table = check_table_name(table)
        self._local = threading.local()
        self._connections: list[sqlite3.Connection] = []
        self._guard = threading.Lock()
        self.skipped = 0  # transactions another instance had applied already
        conn = self.connect()
        conn.execute(f"CREATE TABLE IF NOT EXISTS {table} "
                     "(partition_id INTEGER PRIMARY KEY, high_water_mark INTEGER NOT NULL)")
        self.create_schema(conn)

    def connect(self) -> sqlite3.Connection:
        """This thread's connection (autocommit mode: the helper opens its own transactions)."""
        conn: sqlite3.Connection | None = getattr(self._local, "connection", None)
        if conn is None:
            conn = sqlite3.connect(self.database, timeout=30.0, isolation_level=None, check_same_thread=False)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA busy_timeout=30000")
            self._local.connection = conn
            with self._guard:
                self._connections.append(conn)
        return conn

    def create_schema(self, connection: sqlite3.Connection) -> None:
        """Create the application's tables (called once at construction)."""

    @helper_default
    def apply(self, transaction: Transaction, connection: GuardedConnection) -> None:
        """Make the transaction's changes; the helper commits them with the high-water mark. Implement this, or
        apply_batch (then this is not called)."""
        raise NotImplementedError(f"{type(self).__name__} implements neither apply() nor apply_batch()")

    def get_client_high_water_mark(self, partition_id: int) -> int:
        conn = self.connect()
        conn.execute(f"INSERT OR IGNORE INTO {self.table} (partition_id, high_water_mark) VALUES (?, -1)",
                     (partition_id,))
        row = conn.execute(f"SELECT high_water_mark FROM {self.table} WHERE partition_id = ?",
                           (partition_id,)).fetchone()
        return int(row[0])

    @helper_default
    def apply_batch(self, transactions: Sequence[Transaction], connection: GuardedConnection) -> None:
        """Make a batch's changes (consecutive transactions, in id order): apply() for each. Override it to
        write a batch with fewer statements (executemany); the helper commits it with the high-water mark."""
        for transaction in transactions:
            self.apply(transaction, connection)

    def _apply_in_one_transaction(self, transactions: list[Transaction], what: str) -> int:
        conn = self.connect()
        pid = transactions[0].partition_id
        conn.execute("BEGIN IMMEDIATE")  # the write lock: no other instance moves the mark until COMMIT
        try:
            conn.execute(f"INSERT OR IGNORE INTO {self.table} (partition_id, high_water_mark) VALUES (?, -1)", (pid,))
            current = self._stored_high_water_mark(conn, pid)
            todo = still_to_apply(transactions, current)
            if todo:
                self.apply_batch(todo, GuardedConnection(conn))
                changed = conn.execute(
                    f"UPDATE {self.table} SET high_water_mark = ? WHERE partition_id = ? AND high_water_mark = ?",
                    (todo[-1].transaction_id, pid, current)).rowcount
                if changed != 1:  # cannot happen under the write lock: refuse rather than commit a doubt
                    raise WaltzError(f"partition {pid}: the high-water mark moved under the write lock")
                conn.execute("COMMIT")
            else:
                conn.execute("ROLLBACK")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        return len(transactions) - len(todo)

    def query_all(self, sql: str, *parameters: Any) -> list[Any]:
        """Rows of a read-only query on this thread's connection (for applications and tests)."""
        return list(self.connect().execute(sql, parameters).fetchall())

    def _stored_high_water_mark(self, conn: sqlite3.Connection, partition_id: int) -> int:
        row = conn.execute(f"SELECT high_water_mark FROM {self.table} WHERE partition_id = ?",
                           (partition_id,)).fetchone()
        return -1 if row is None else int(row[0])

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close every connection this object opened (`with` does it on leaving)."""
        with self._guard:
            for conn in self._connections:
                conn.close()
            self._connections.clear()
        self._local = threading.local()
