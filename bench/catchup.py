"""Catch-up into a database: an application instance joining a long log, applying it into PostgreSQL and SQLite
with the client's helpers, per transaction (as before issue 27) and in batches.

    .venv/bin/python -m bench.catchup [--quick] [--size N]

A LocalCluster (3 storage replicas, 1 server, 1 partition) is filled once with N transactions of 512 B (default
100,000; raw streams, many appends in flight: the fast path). Then, for each database, an instance starts against
an empty database (the helpers' high-water mark -1) and the time from its start to its partition being mounted
(a mount completes once the catch-up feed is applied) gives the rate. The application's apply inserts one row
(partition, transaction id, data) per transaction, as a journal would.

Rows, in the same run:
  - per transaction (baseline): what an application had before: one database transaction, one high-water-mark
    update and one GetTransactionData call per transaction (the client's apply_transaction path, a driver without
    ReadTransactions). It runs over the last BASELINE_SIZE transactions of the log only (its database starts at
    N - BASELINE_SIZE - 1): at a few hundred per second the whole log would take minutes per database.
  - batched: apply_transactions, a feed batch (up to server.feedBatchSize) in one database transaction with one
    high-water-mark update, the batch's data read in one ReadTransactions call. The whole log. Twice: with the
    application's apply() run per row (the helper's default apply_batch; PostgreSQL's statements pipelined), and
    with an apply_batch that writes the batch in one statement (PostgreSQL: COPY; SQLite: executemany).
  - no database: the application only reads each transaction's data: what the client itself reaches here.
The log is read once through the server before the first row (untimed), so that no row pays for cold caches
the next ones find warm. PostgreSQL is a throwaway server (waltz_common.testing.postgres: initdb/pg_ctl, fsync
off); SQLite a file in the work directory (WAL). The machine is shared: the load average is printed with the table.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sqlite3
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import psycopg

from bench.curves.common import LoadLog, fill, table, verdict, wait_owned
from waltz_client import AsyncWaltzClient, Transaction, WaltzClientCallbacks
from waltz_client.config import ClientConfig
from waltz_client.grpc_driver import GrpcDriver
from waltz_client.postgres_callbacks import PgGuardedConnection, PostgresClientCallbacks
from waltz_client.sqlite_callbacks import GuardedConnection, SqliteClientCallbacks
from waltz_common.testing.local_cluster import LocalCluster
from waltz_common.testing.postgres import PostgresProcess
from waltz_common.testing.zookeeper import ZooKeeperProcess

FULL_SIZE = 100_000
QUICK_SIZE = 1_000
BASELINE_SIZE = 5_000  # the per-transaction baseline's share of the log (the last ones); at most the log
TARGET_RATE = 5_000.0  # transactions/s applied (issue 27: 15x the 340/s measured)
CLIENT = {"client.mountTimeout": 3600.0, "client.requestTimeout": 60.0}


class PgJournal(PostgresClientCallbacks):
    def create_schema(self, connection: PgGuardedConnection) -> None:
        connection.execute("CREATE TABLE IF NOT EXISTS journal (partition_id INTEGER, transaction_id BIGINT, "
                           "data BYTEA)")

    def apply(self, transaction: Transaction, connection: PgGuardedConnection) -> None:
        connection.execute("INSERT INTO journal VALUES (%s, %s, %s)",
                           (transaction.partition_id, transaction.transaction_id, transaction.data()))


class SqliteJournal(SqliteClientCallbacks):
    def create_schema(self, connection: sqlite3.Connection) -> None:
        connection.execute("CREATE TABLE IF NOT EXISTS journal (partition_id INTEGER, transaction_id INTEGER, "
                           "data BLOB)")

    def apply(self, transaction: Transaction, connection: GuardedConnection) -> None:
        connection.execute("INSERT INTO journal VALUES (?, ?, ?)",
                           (transaction.partition_id, transaction.transaction_id, transaction.data()))


class PgJournalCopy(PgJournal):
    """A batch in one COPY: what apply_batch is for."""

    def apply_batch(self, transactions: Sequence[Transaction], connection: PgGuardedConnection) -> None:
        with connection.cursor() as cursor, cursor.copy(
                "COPY journal (partition_id, transaction_id, data) FROM STDIN") as copy:
            for t in transactions:
                copy.write_row((t.partition_id, t.transaction_id, t.data()))


class DataOnly(WaltzClientCallbacks):
    """No database: reads each transaction's data and keeps the high-water mark in memory (the client's ceiling)."""

    def __init__(self) -> None:
        self.hwm = -1

    def get_client_high_water_mark(self, partition_id: int) -> int:
        return self.hwm

    def apply_transaction(self, transaction: Transaction) -> None:
        self.apply_transactions([transaction])

    def apply_transactions(self, transactions: list[Transaction]) -> None:
        for transaction in transactions:
            transaction.data()
        self.hwm = transactions[-1].transaction_id

    def __enter__(self) -> DataOnly:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


class SqliteJournalMany(SqliteJournal):
    def apply_batch(self, transactions: Sequence[Transaction], connection: GuardedConnection) -> None:
        connection.executemany("INSERT INTO journal VALUES (?, ?, ?)",
                               [(t.partition_id, t.transaction_id, t.data()) for t in transactions])


class PgJournalPerTransaction(PgJournal):
    apply_transactions = WaltzClientCallbacks.apply_transactions  # the client's per-transaction path


class SqliteJournalPerTransaction(SqliteJournal):
    apply_transactions = WaltzClientCallbacks.apply_transactions


class OneAtATimeDriver(GrpcDriver):
    """A driver without ReadTransactions: each transaction's data is its own GetTransactionData call."""

    async def read_transactions(self, endpoint: str, partition_id: int, first: int, last: int,
                                timeout: float) -> Any:
        raise NotImplementedError("one at a time (the baseline)")


def _catch_up(callbacks: WaltzClientCallbacks, config: dict[str, Any], one_at_a_time: bool) -> float:
    """Seconds from the client's start to its partition mounted (the catch-up applied)."""

    async def run() -> float:
        driver = OneAtATimeDriver(ClientConfig.of(config)) if one_at_a_time else None
        started = time.perf_counter()
        async with AsyncWaltzClient(callbacks, config, driver=driver) as client:
            await client.wait_mounted()
            return time.perf_counter() - started

    return asyncio.run(run())


async def _read_all(config: dict[str, Any], size: int) -> None:
    """Read the whole log once through the server (untimed), as a warm-up."""
    async with AsyncWaltzClient(_NoApply(), {**config, "client.autoMount": False}) as client:
        for first in range(0, size, 1000):
            await client.transaction_range(0, first, min(size, first + 1000) - 1)


class _NoApply(WaltzClientCallbacks):
    def get_client_high_water_mark(self, partition_id: int) -> int:
        return -1

    def apply_transaction(self, transaction: Transaction) -> None:
        raise AssertionError("nothing is mounted")


def measure(name: str, kinds: Sequence[type[Any]], make: Callable[[type[Any]], Any],
            set_mark: Callable[[Any, int], None], config: dict[str, Any], size: int,
            baseline_size: int) -> list[list[object]]:
    """The rows of one database: the baseline (kinds[0], per transaction), then each batched kind."""
    rows: list[list[object]] = []
    baseline = make(kinds[0])
    with baseline:
        set_mark(baseline, size - baseline_size - 1)
        seconds = _catch_up(baseline, config, one_at_a_time=True)
    base_rate = baseline_size / seconds
    rows.append([f"{name}, per transaction (baseline)", baseline_size, seconds, base_rate, 1.0, ""])
    for kind in kinds[1:]:
        label = "batched, apply() per row" if kind.apply_batch is kinds[1].apply_batch else (
            f"batched, apply_batch: {'COPY' if kind is PgJournalCopy else 'executemany'}")
        batched = make(kind)
        with batched:
            seconds = _catch_up(batched, config, one_at_a_time=False)
            applied = batched.get_client_high_water_mark(0) + 1
        rate = applied / seconds
        rows.append([f"{name}, {label}", applied, seconds, rate, rate / base_rate,
                     f">= {TARGET_RATE:,.0f}/s: {verdict(rate >= TARGET_RATE)}"])
    return rows


def run(workdir: Path, size: int, baseline_size: int) -> str:
    load = LoadLog()
    with ZooKeeperProcess(workdir / "zookeeper") as zookeeper, PostgresProcess() as postgres:
        load.mark("start")
        with LocalCluster(workdir / "cluster", zookeeper=zookeeper.connect_string,
                          cluster_root="/bench/catchup") as cluster:
            address = wait_owned(cluster, 1)[0]
            started = time.perf_counter()
            fill_rate = fill(cluster, address, 0, size)
            fill_s = time.perf_counter() - started
            config = cluster.client_config(**CLIENT)
            asyncio.run(_read_all(config, size))  # every row then meets the same server caches
            load.mark("after the fill")
            databases = iter(range(1000))

            def pg(kind: type[PgJournal]) -> PgJournal:
                database = f"catchup{next(databases)}"
                with psycopg.connect(postgres.dsn(), autocommit=True) as admin:
                    admin.execute(f"CREATE DATABASE {database}")
                return kind(postgres.dsn(database))

            def sqlite(kind: type[SqliteJournal]) -> SqliteJournal:
                return kind(workdir / f"catchup{next(databases)}.db")

            def pg_mark(callbacks: PgJournal, mark: int) -> None:
                callbacks.get_client_high_water_mark(0)
                callbacks.query_all(f"UPDATE {callbacks.table} SET high_water_mark = %s WHERE partition_id = 0 "
                                    "RETURNING 1", mark)

            def sqlite_mark(callbacks: SqliteJournal, mark: int) -> None:
                callbacks.get_client_high_water_mark(0)
                callbacks.connect().execute(f"UPDATE {callbacks.table} SET high_water_mark = ? WHERE partition_id = 0",
                                            (mark,))

            rows = measure("PostgreSQL", (PgJournalPerTransaction, PgJournal, PgJournalCopy), pg, pg_mark, config,
                           size, baseline_size)
            load.mark("after PostgreSQL")
            rows += measure("SQLite", (SqliteJournalPerTransaction, SqliteJournal, SqliteJournalMany), sqlite,
                            sqlite_mark, config, size, baseline_size)
            with DataOnly() as alone:
                seconds = _catch_up(alone, config, one_at_a_time=False)
            rows.append(["no database: data() only (the client's ceiling)", size, seconds, size / seconds, "", ""])
            load.mark("end")
    return "\n".join([
        load.line(), "",
        f"catch-up of a {size:,}-transaction log (512 B each, filled in {fill_s:.0f} s at {fill_rate:,.0f}/s) into "
        "a journal table: start of the instance to its partition mounted",
        table(["", "transactions", "seconds", "applied/s", "x baseline", "target"], rows),
        "(the machine is shared and noisy: compare rows of the same run, not runs)",
    ])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help=f"the short form (a smoke run: {QUICK_SIZE:,} transactions)")
    parser.add_argument("--size", type=int, default=None, help=f"transactions in the log (default {FULL_SIZE:,})")
    parser.add_argument("--dir", default=None, help="work directory (default: a temporary one)")
    args = parser.parse_args(argv)
    size = args.size or (QUICK_SIZE if args.quick else FULL_SIZE)
    baseline_size = min(BASELINE_SIZE if not args.quick else 200, size)
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("kazoo").setLevel(logging.ERROR)
    with tempfile.TemporaryDirectory(prefix="waltz-catchup-", dir=args.dir) as workdir:
        print(run(Path(workdir), size, baseline_size))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
