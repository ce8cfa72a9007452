"""One instance of the contention workload (bench/contention.py, tests/integration/client/test_contention.py).

    python -m bench.contention_instance --config client.json --database DB --out PREFIX
        [--submitters 20] [--items 4] [--seconds 30]

An application instance as a user writes one from the docs: an AsyncWaltzClient applying the log into its own
SQLite database (SqliteClientCallbacks, batched; or, with --postgres, a PostgreSQL database with
AsyncPostgresClientCallbacks, a few statements per transaction, or with --batch-apply per feed batch: executemany and
COPY; or with --sync-helper the synchronous PostgresClientCallbacks), and many concurrent reservers. A reservation's
execute() reads the item's reserved count from the instance's own database and takes a write lock on the item; the
payload says which count it saw, and apply() checks that it is the count the log has reached (a reservation that
acted on a stale read is an oversell: counted in `stale`, never expected).

It measures, from the application's side only, so that it runs the same against any revision of the client:
when each reservation committed; each lock failure's answer latency (from the end of the execute() that built the
append to the on_lock_failure hook, and to the LockFailure's arrival on the client's loop); each re-execution's
delay after the transaction that failed it was applied (the conflicting id, and the arrival, are taken from
TransactionMonitor.on_lock_failure, wrapped: the one client-internal it reads);
the applied lag (the server's high-water mark minus what the database holds, every 0.25 s); and the callback
thread's CPU time (and, with each lag sample, the process's and the callback thread's CPU so far). It writes
PREFIX.ready once mounted, starts when PREFIX.go exists, runs --seconds, drains, writes PREFIX.stopped and waits
for PREFIX.drain (every instance has stopped), then waits until it has applied the whole log, and writes PREFIX.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from waltz_client import AsyncWaltzClient, Transaction, TransactionBuilder, TransactionContext
from waltz_client import monitor as monitor_module
from waltz_client import partition as partition_module
from waltz_client.locks import PartitionLocalLock
from waltz_client.postgres_async import AsyncPgGuardedConnection, AsyncPostgresClientCallbacks
from waltz_client.postgres_callbacks import PgGuardedConnection, PostgresClientCallbacks
from waltz_client.sqlite_callbacks import GuardedConnection, SqliteClientCallbacks

LOCK_NAME = "item"
ROWS_SQL = "SELECT transaction_id, item, seen, instance FROM reservations ORDER BY transaction_id"
PG_SCHEMA = ("CREATE TABLE IF NOT EXISTS items (item INTEGER PRIMARY KEY, reserved INTEGER NOT NULL)",
             "CREATE TABLE IF NOT EXISTS reservations (transaction_id BIGINT PRIMARY KEY, item INTEGER NOT NULL, "
             "seen INTEGER NOT NULL, instance TEXT NOT NULL)")
PG_RESERVED = "SELECT reserved FROM items WHERE item = %s"
PG_UPSERT = ("INSERT INTO items (item, reserved) VALUES (%s, 1) "
             "ON CONFLICT (item) DO UPDATE SET reserved = items.reserved + 1")
PG_INSERT = "INSERT INTO reservations VALUES (%s, %s, %s, %s)"


class Measured:
    """What an instance's callbacks record of their applies, with either database."""

    def __init__(self) -> None:
        self.applied = -1  # the last transaction id committed into the database
        self.applied_at: dict[int, float] = {}  # transaction id -> when its batch was committed
        self.stale = 0  # reservations whose execute() saw another count than the log had reached
        self.apply_s = 0.0  # time spent in apply_transactions

    def measure_apply(self, transactions: list[Transaction], apply: Callable[[list[Transaction]], None]) -> None:
        started = time.monotonic()
        apply(transactions)
        now = time.monotonic()
        self.apply_s += now - started
        for transaction in transactions:
            self.applied_at[transaction.transaction_id] = now
        self.applied = max(self.applied, transactions[-1].transaction_id)

    def check(self, seen: int, row: Any) -> None:
        """Count a reservation whose execute() saw another count than the log has reached (row: the item's)."""
        if seen != (0 if row is None else int(row[0])):
            self.stale += 1

    def reserved(self, item: int) -> int:
        raise NotImplementedError

    async def rows(self) -> list[Any]:
        raise NotImplementedError


class Reservations(Measured, SqliteClientCallbacks):
    """The instance's database: reserved units per item, and one row per reservation."""

    def __init__(self, database: str | Path) -> None:
        Measured.__init__(self)
        SqliteClientCallbacks.__init__(self, database)

    def create_schema(self, connection: Any) -> None:
        connection.execute("CREATE TABLE IF NOT EXISTS items (item INTEGER PRIMARY KEY, reserved INTEGER NOT NULL)")
        connection.execute("CREATE TABLE IF NOT EXISTS reservations (transaction_id INTEGER PRIMARY KEY, "
                           "item INTEGER NOT NULL, seen INTEGER NOT NULL, instance TEXT NOT NULL)")

    def reserved(self, item: int) -> int:
        row = self.connect().execute("SELECT reserved FROM items WHERE item = ?", (item,)).fetchone()
        return 0 if row is None else int(row[0])

    def apply(self, transaction: Transaction, connection: GuardedConnection) -> None:
        payload = json.loads(transaction.data())
        item, seen = payload["item"], payload["seen"]
        self.check(seen, connection.execute("SELECT reserved FROM items WHERE item = ?", (item,)).fetchone())
        connection.execute("INSERT INTO items (item, reserved) VALUES (?, 1) "
                           "ON CONFLICT (item) DO UPDATE SET reserved = reserved + 1", (item,))
        connection.execute("INSERT INTO reservations VALUES (?, ?, ?, ?)",
                           (transaction.transaction_id, item, seen, payload["by"]))

    def apply_transactions(self, transactions: list[Transaction]) -> None:
        self.measure_apply(transactions, super().apply_transactions)

    async def rows(self) -> list[Any]:
        rows = self.query_all(ROWS_SQL)
        self.close()
        return rows


class PgReservations(Measured, AsyncPostgresClientCallbacks):
    """The same in PostgreSQL, with the asyncio helper (batches in one transaction); execute() reads with
    query_all_blocking, as the client guide says."""

    def __init__(self, dsn: str) -> None:
        Measured.__init__(self)
        AsyncPostgresClientCallbacks.__init__(self, dsn)

    async def create_schema(self, connection: AsyncPgGuardedConnection) -> None:
        for sql in PG_SCHEMA:
            await connection.execute(sql)

    def reserved(self, item: int) -> int:
        if hasattr(AsyncPostgresClientCallbacks, "query_all_blocking"):
            rows = self.query_all_blocking(PG_RESERVED, item)
        else:  # a baseline revision's helper, from before issue 31: what query_all_blocking does
            rows = self._on_loop(self.query_all(PG_RESERVED, item))
        return int(rows[0][0]) if rows else 0

    async def apply(self, transaction: Transaction, connection: AsyncPgGuardedConnection) -> None:
        payload = json.loads(transaction.data())  # read already: the helper reads a batch's data first
        item, seen = payload["item"], payload["seen"]
        self.check(seen, await (await connection.execute(PG_RESERVED, (item,))).fetchone())
        await connection.execute(PG_UPSERT, (item,))
        await connection.execute(PG_INSERT, (transaction.transaction_id, item, seen, payload["by"]))

    def apply_transactions(self, transactions: list[Transaction]) -> None:
        self.measure_apply(transactions, super().apply_transactions)

    async def rows(self) -> list[Any]:
        rows = await self.query_all(ROWS_SQL)
        await self.close()
        return [list(row) for row in rows]


class PgBatchReservations(PgReservations):
    """PgReservations writing a whole feed batch at once (--batch-apply), as the service of issue 31 did: one
    SELECT of the batch's items, the stale checks in Python, one upsert per item, the reservations with COPY."""

    async def apply_batch(self, transactions: Sequence[Transaction], connection: AsyncPgGuardedConnection) -> None:
        payloads = [json.loads(transaction.data()) for transaction in transactions]
        items = sorted({payload["item"] for payload in payloads})
        cursor = await connection.execute("SELECT item, reserved FROM items WHERE item = ANY(%s)", (items,))
        counts = dict.fromkeys(items, 0)
        counts.update({int(item): int(reserved) for item, reserved in await cursor.fetchall()})
        rows = []
        for transaction, payload in zip(transactions, payloads, strict=True):
            item, seen = payload["item"], payload["seen"]
            if seen != counts[item]:
                self.stale += 1
            counts[item] += 1
            rows.append((transaction.transaction_id, item, seen, payload["by"]))
        writer = connection.cursor()
        await writer.executemany("INSERT INTO items (item, reserved) VALUES (%s, %s) ON CONFLICT (item) DO UPDATE "
                                 "SET reserved = EXCLUDED.reserved", [(item, counts[item]) for item in items])
        async with writer.copy("COPY reservations (transaction_id, item, seen, instance) FROM STDIN") as copy:
            for row in rows:
                await copy.write_row(row)


class PgSyncReservations(Measured, PostgresClientCallbacks):
    """The same with the synchronous helper (--sync-helper): its applies and execute()'s reads run on the callback
    thread's own connection, not through the event loop (the client calls callbacks on that thread either way)."""

    def __init__(self, dsn: str) -> None:
        Measured.__init__(self)
        PostgresClientCallbacks.__init__(self, dsn)

    def create_schema(self, connection: PgGuardedConnection) -> None:
        for sql in PG_SCHEMA:
            connection.execute(sql)

    def reserved(self, item: int) -> int:
        rows = self.query_all(PG_RESERVED, item)
        return int(rows[0][0]) if rows else 0

    def apply(self, transaction: Transaction, connection: PgGuardedConnection) -> None:
        payload = json.loads(transaction.data())
        item, seen = payload["item"], payload["seen"]
        self.check(seen, connection.execute(PG_RESERVED, (item,)).fetchone())
        connection.execute(PG_UPSERT, (item,))
        connection.execute(PG_INSERT, (transaction.transaction_id, item, seen, payload["by"]))

    def apply_transactions(self, transactions: list[Transaction]) -> None:
        self.measure_apply(transactions, super().apply_transactions)

    async def rows(self) -> list[Any]:
        rows = self.query_all(ROWS_SQL)
        self.close()
        return [list(row) for row in rows]


class Reservation(TransactionContext):
    """Reserve one unit of an item: read its count from the database, write-lock it, append."""

    def __init__(self, run: Run, item: int) -> None:
        self.run = run
        self.item = item
        self.sent_at = 0.0  # when the last execute() returned (its append is sent right after)
        self.conflict: int | None = None  # set by the wrapped TransactionMonitor.on_lock_failure
        self.arrived = 0.0  # when the LockFailure reached the client's loop (the wrapped on_lock_failure)

    def partition_id(self, num_partitions: int) -> int:
        return 0

    def execute(self, builder: TransactionBuilder) -> bool:
        run = self.run
        started = time.monotonic()
        if self.conflict is not None:  # a re-execution after a lock failure
            applied_at = run.db.applied_at.get(self.conflict)
            run.reexecutions.append(started - applied_at if applied_at is not None else -1.0)
            self.conflict = None
        seen = run.db.reserved(self.item)
        builder.set_write_locks([PartitionLocalLock(LOCK_NAME, self.item)])
        builder.set_data(json.dumps({"item": self.item, "seen": seen, "by": run.name}).encode())
        self.sent_at = time.monotonic()
        run.execute_s += self.sent_at - started
        return True

    def on_lock_failure(self) -> None:
        now = time.monotonic()
        self.run.lock_failures.append((now, now - self.sent_at, self.arrived - self.sent_at))


class Run:
    def __init__(self, name: str, db: Measured) -> None:
        self.name = name
        self.db = db
        self.commits: list[float] = []
        self.lock_failures: list[tuple[float, float, float]] = []  # (when, latency, its LockFailure's arrival)
        self.reexecutions: list[float] = []  # delays after the conflicting transaction was applied
        self.lags: list[tuple[float, int]] = []
        self.cpu: list[tuple[float, float, float]] = []  # (when, process CPU s, callback thread CPU s), with lags
        self.loop_delays: list[float] = []  # how late the client's event loop ran a 5 ms timer (LOOP_TICK_S)
        self.execute_s = 0.0
        self.errors: list[str] = []


def _wrap_monitor() -> None:
    """Tell each lock-failed Reservation which transaction failed it (for the re-execution delay)."""
    original = monitor_module.TransactionMonitor.on_lock_failure

    def on_lock_failure(self: Any, req_id: Any, transaction_id: int) -> Any:
        outcomes = original(self, req_id, transaction_id)
        for token, _ in outcomes:
            context = getattr(token, "context", None)
            if isinstance(context, Reservation):
                context.conflict = transaction_id
                context.arrived = time.monotonic()
        return outcomes

    monitor_module.TransactionMonitor.on_lock_failure = on_lock_failure  # type: ignore[method-assign]


def _wrap_deliver(fed_at: dict[int, float]) -> None:
    """Record when each transaction id first reached the client's loop in a feed message (fed_at)."""
    original = partition_module.ClientPartition.deliver

    def deliver(self: Any, conn: Any, message: Any) -> Any:
        if message is not None and message.WhichOneof("message") == "feed":
            now = time.monotonic()
            for entry in message.feed.transactions:
                fed_at.setdefault(entry.transaction_id, now)
        return original(self, conn, message)

    partition_module.ClientPartition.deliver = deliver  # type: ignore[method-assign]


def _thread_cpu_s(name: str) -> float:
    for thread in threading.enumerate():
        if thread.name == name and thread.ident is not None:
            return time.clock_gettime(time.pthread_getcpuclockid(thread.ident))
    return 0.0


async def _reserver(client: AsyncWaltzClient, run: Run, items: int, index: int, stop: asyncio.Event) -> None:
    seq = 0
    while not stop.is_set():
        item = (index * 7 + seq) % items
        seq += 1
        try:
            committed = await client.submit_and_wait(Reservation(run, item))
        except Exception as exc:
            run.errors.append(f"{type(exc).__name__}: {exc}")
            await asyncio.sleep(0.1)
            continue
        if committed:
            run.commits.append(time.monotonic())


LOOP_TICK_S = 0.005


async def _sample_loop(run: Run, stop: asyncio.Event) -> None:
    """How late the client's event loop (its streams, and with --postgres every database call) runs a timer: what
    a LockFailure that has arrived waits before the client reads it."""
    while not stop.is_set():
        started = time.monotonic()
        await asyncio.sleep(LOOP_TICK_S)
        run.loop_delays.append(time.monotonic() - started - LOOP_TICK_S)


async def _sample_lag(client: AsyncWaltzClient, run: Run, stop: asyncio.Event) -> None:
    while not stop.is_set():
        try:
            server = await client.high_water_mark(0)
        except Exception:
            server = None
        if server is not None:
            run.lags.append((time.monotonic(), max(0, server - run.db.applied)))
        run.cpu.append((time.monotonic(), time.process_time(), _thread_cpu_s("waltz-callbacks")))
        await asyncio.sleep(0.25)


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    out = Path(args.out)
    config = json.loads(Path(args.config).read_text())
    db: Measured
    if args.postgres and args.sync_helper:
        db = PgSyncReservations(args.postgres)
    elif args.postgres:
        db = PgBatchReservations(args.postgres) if args.batch_apply else PgReservations(args.postgres)
        await db.open()
    else:
        db = Reservations(args.database)
    run = Run(out.name, db)
    _wrap_monitor()
    fed_at: dict[int, float] = {}
    _wrap_deliver(fed_at)
    async with AsyncWaltzClient(db, config) as client:
        await client.wait_mounted()
        out.with_suffix(".ready").write_text("")
        while not out.with_suffix(".go").exists():
            await asyncio.sleep(0.02)
        stop = asyncio.Event()
        cpu0, started = _thread_cpu_s("waltz-callbacks"), time.monotonic()
        tasks = [asyncio.create_task(_reserver(client, run, args.items, i, stop)) for i in range(args.submitters)]
        sampler = asyncio.create_task(_sample_lag(client, run, stop))
        loop_sampler = asyncio.create_task(_sample_loop(run, stop))
        await asyncio.sleep(args.seconds)
        stop.set()
        cpu1, ended = _thread_cpu_s("waltz-callbacks"), time.monotonic()
        await asyncio.wait(tasks, timeout=120)
        await sampler
        await loop_sampler
        # every instance stops before any takes its final mark: one still committing would move the mark past
        # what another had drained to
        out.with_suffix(".stopped").write_text("")
        while not out.with_suffix(".drain").exists():
            await asyncio.sleep(0.02)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and db.applied < await client.high_water_mark(0):
            await asyncio.sleep(0.1)
        final = await client.high_water_mark(0)
    rows = await db.rows()
    return {
        "name": run.name, "started": started, "ended": ended, "commits": run.commits,
        "lock_failures": run.lock_failures, "reexecutions": run.reexecutions, "lags": run.lags, "cpu": run.cpu,
        "loop_delays": run.loop_delays,
        "callback_cpu_s": cpu1 - cpu0, "execute_s": run.execute_s, "apply_s": db.apply_s,
        "errors": run.errors[:20], "error_count": len(run.errors), "stale": db.stale,
        "applied": db.applied, "final": final, "rows": rows, "applied_at": db.applied_at,
        "fed_at": fed_at,
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True, help="the client configuration, a JSON object of dotted keys")
    parser.add_argument("--database", required=True, help="the instance's SQLite database file")
    parser.add_argument("--postgres", help="a PostgreSQL database's DSN to apply into instead (the asyncio helper)")
    parser.add_argument("--batch-apply", action="store_true", help="with --postgres: write each feed batch at once")
    parser.add_argument("--sync-helper", action="store_true",
                        help="with --postgres: the synchronous PostgresClientCallbacks instead of the asyncio one")
    parser.add_argument("--out", required=True, help="path prefix of the .ready, .go and .json files")
    parser.add_argument("--submitters", type=int, default=20)
    parser.add_argument("--items", type=int, default=4, help="hot items (one write lock each)")
    parser.add_argument("--seconds", type=float, default=30.0)
    args = parser.parse_args(argv)
    result = asyncio.run(main_async(args))
    out = Path(args.out).with_suffix(".json")
    out.with_suffix(".tmp").write_text(json.dumps(result))
    out.with_suffix(".tmp").replace(out)


if __name__ == "__main__":
    main()
