"""SqliteClientCallbacks: apply the feed exactly once into a SQLite database shared by instances."""

from __future__ import annotations

import re
import sqlite3
import threading
from abc import abstractmethod
from pathlib import Path
from typing import Any

from waltz_client.api import Transaction, WaltzClientCallbacks
from waltz_client.errors import WaltzError

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


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


class SqliteClientCallbacks(WaltzClientCallbacks):
    """Applies each transaction and moves the partition's high-water mark in ONE database
    transaction, with compare-and-set, so that several application instances sharing the
    database apply every transaction exactly once: the instance whose

        UPDATE <table> SET high_water_mark = :txn WHERE partition_id = :p AND high_water_mark = :txn - 1

    changes a row applies it; the others see no row changed and skip it. Subclasses implement
    apply(transaction, connection) with the connection they are given (no commit/rollback).
    Connections are per thread; `connect()` gives the calling thread's (for reads in execute).
    """

    def __init__(self, database: str | Path, table: str = "waltz_client_high_water_mark") -> None:
        if str(database) == ":memory:":
            raise ValueError("use a database file: every thread's :memory: connection is a separate database")
        if not _NAME.match(table):
            raise ValueError(f"not a plain SQL table name: {table!r}")
        self.database = str(database)
        self.table = table
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

    @abstractmethod
    def apply(self, transaction: Transaction, connection: GuardedConnection) -> None:
        """Make the transaction's changes; the helper commits them with the high-water mark."""

    def get_client_high_water_mark(self, partition_id: int) -> int:
        conn = self.connect()
        conn.execute(f"INSERT OR IGNORE INTO {self.table} (partition_id, high_water_mark) VALUES (?, -1)",
                     (partition_id,))
        row = conn.execute(f"SELECT high_water_mark FROM {self.table} WHERE partition_id = ?",
                           (partition_id,)).fetchone()
        return int(row[0])

    def apply_transaction(self, transaction: Transaction) -> None:
        conn = self.connect()
        txn_id, pid = transaction.transaction_id, transaction.partition_id
        conn.execute("BEGIN IMMEDIATE")
        try:
            changed = conn.execute(
                f"UPDATE {self.table} SET high_water_mark = ? WHERE partition_id = ? AND high_water_mark = ?",
                (txn_id, pid, txn_id - 1)).rowcount
            if changed == 0:
                current = self._stored_high_water_mark(conn, pid)
                conn.execute("ROLLBACK")
                if current < txn_id:
                    raise WaltzError(f"partition {pid}: the database's high-water mark is {current}, "
                                     f"cannot apply transaction {txn_id}")
                self.skipped += 1
                return
            self.apply(transaction, GuardedConnection(conn))
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise

    def query_all(self, sql: str, *parameters: Any) -> list[Any]:
        """Rows of a read-only query on this thread's connection (for applications and tests)."""
        return list(self.connect().execute(sql, parameters).fetchall())

    def _stored_high_water_mark(self, conn: sqlite3.Connection, partition_id: int) -> int:
        row = conn.execute(f"SELECT high_water_mark FROM {self.table} WHERE partition_id = ?",
                           (partition_id,)).fetchone()
        return -1 if row is None else int(row[0])

    def close(self) -> None:
        """Close every connection this object opened."""
        with self._guard:
            for conn in self._connections:
                conn.close()
            self._connections.clear()
        self._local = threading.local()
