"""The asyncio PostgreSQL helper on its own: what one feed batch's apply and one execute() read cost the client's
callback thread, next to a baseline revision's helper in the same run.

    python -m bench.pg_helper [--baseline REV] [--rounds N] [--operations N] [--loop-busy F]

A throwaway PostgreSQL server (started once, one database per worker run) and, per run, one worker process
holding an AsyncPostgresClientCallbacks on a running event loop, called from a second thread as the client's
callback thread calls it: apply_transactions of batches of 1 and of 5 transactions (and the same with the
synchronous PostgresClientCallbacks) (each apply() as
bench.contention's service: a SELECT of the item's count, an upsert, an INSERT of the reservation), and
query_all_blocking of one row (an execute() reading its state). The loop is idle, or busy a fraction --loop-busy of
the time with 1 ms slices of work (the client's own: its streams, its submitters), as in an application. The table
gives per operation the wall time the calling thread waits (what the callback thread is busy for) and the process's
CPU (the busy slices taken out), best of the rounds, and candidate / baseline. The baseline's waltz_client
(default: `git merge-base HEAD main`) is imported first in its worker processes (bench.package_baseline); rounds
alternate which goes first.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import threading
import time
import uuid
from typing import Any

SYNC_IDS = 1_000_000_000  # the sync helper's reservations: ids of their own in the shared table
OPERATIONS = (  # (name, the synchronous helper's, transactions per batch: 0 for a read in execute())
    ("apply batch of 1", False, 1), ("apply batch of 5", False, 5), ("read in execute()", False, 0),
    ("sync: apply batch of 1", True, 1), ("sync: apply batch of 5", True, 5),
)


def _worker(dsn: str, operations: int, loop_busy: float) -> dict[str, Any]:
    import waltz_client
    from waltz_client.api import Transaction
    from waltz_client.postgres_async import AsyncPgGuardedConnection, AsyncPostgresClientCallbacks
    from waltz_client.postgres_callbacks import PgGuardedConnection, PostgresClientCallbacks

    class Reservations(AsyncPostgresClientCallbacks):
        async def create_schema(self, connection: AsyncPgGuardedConnection) -> None:
            await connection.execute("CREATE TABLE IF NOT EXISTS items (item INTEGER PRIMARY KEY, "
                                     "reserved INTEGER NOT NULL)")
            await connection.execute("CREATE TABLE IF NOT EXISTS reservations (transaction_id BIGINT PRIMARY KEY, "
                                     "item INTEGER NOT NULL, seen INTEGER NOT NULL)")

        async def apply(self, transaction: Transaction, connection: AsyncPgGuardedConnection) -> None:
            item = transaction.transaction_id % 4
            row = await (await connection.execute("SELECT reserved FROM items WHERE item = %s", (item,))).fetchone()
            seen = 0 if row is None else int(row[0])
            await connection.execute("INSERT INTO items (item, reserved) VALUES (%s, 1) "
                                     "ON CONFLICT (item) DO UPDATE SET reserved = items.reserved + 1", (item,))
            await connection.execute("INSERT INTO reservations VALUES (%s, %s, %s)",
                                     (transaction.transaction_id, item, seen))

    class SyncReservations(PostgresClientCallbacks):
        """The same with the synchronous helper (its own mark table)."""

        def apply(self, transaction: Transaction, connection: PgGuardedConnection) -> None:
            item = transaction.transaction_id % 4
            row = connection.execute("SELECT reserved FROM items WHERE item = %s", (item,)).fetchone()
            seen = 0 if row is None else int(row[0])
            connection.execute("INSERT INTO items (item, reserved) VALUES (%s, 1) "
                               "ON CONFLICT (item) DO UPDATE SET reserved = items.reserved + 1", (item,))
            connection.execute("INSERT INTO reservations VALUES (%s, %s, %s)",
                               (SYNC_IDS + transaction.transaction_id, item, seen))

    def batch(first: int, count: int) -> list[Transaction]:
        return [Transaction(0, i, None, 0, lambda: b"", b"")  # type: ignore[arg-type]
                for i in range(first, first + count)]

    results: dict[str, Any] = {}

    async def main() -> None:
        db = Reservations(dsn)
        await db.open()
        stop = threading.Event()
        spun = [0.0]  # CPU seconds of the busy slices: taken out of the CPU per operation

        async def busy() -> None:  # the client's own work on the loop: 1 ms slices, loop_busy of the time
            while not stop.is_set():
                if loop_busy > 0:
                    started = time.thread_time()
                    end = time.perf_counter() + 0.001
                    while time.perf_counter() < end:
                        pass
                    spun[0] += time.thread_time() - started
                await asyncio.sleep(0.001 * (1 - loop_busy) / loop_busy if loop_busy > 0 else 0.01)

        def callback_thread() -> None:
            db.get_client_high_water_mark(0)
            sync_db = SyncReservations(dsn, table="sync_high_water_mark")
            sync_db.get_client_high_water_mark(0)
            next_ids = {False: 0, True: 0}  # per helper: each has a mark of its own
            for name, sync, count in OPERATIONS:
                helper: Any = sync_db if sync else db
                for warm in (True, False):
                    n = max(1, operations // 10) if warm else operations
                    wall, cpu, spun_before = time.perf_counter(), time.process_time(), spun[0]
                    for _ in range(n):
                        if count:
                            helper.apply_transactions(batch(next_ids[sync], count))
                            next_ids[sync] += count
                        else:
                            db.query_all_blocking("SELECT reserved FROM items WHERE item = %s", 1)
                    if not warm:
                        results[name] = {"wall": (time.perf_counter() - wall) / n,
                                         "cpu": (time.process_time() - cpu - (spun[0] - spun_before)) / n}
            sync_db.close()
            stop.set()

        loader = asyncio.create_task(busy())
        thread = threading.Thread(target=callback_thread, name="waltz-callbacks")
        thread.start()
        while thread.is_alive():
            await asyncio.sleep(0.01)
        await loader
        await db.close()

    asyncio.run(main())
    return {"package": str(next(iter(waltz_client.__path__))), "operations": results}


def main() -> None:
    from bench.package_baseline import add_arguments, compare

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    parser.add_argument("--operations", type=int, default=1000, help="operations of each kind per worker run")
    parser.add_argument("--loop-busy", type=float, default=0.5, help="fraction of the loop's time busy (0..0.9)")
    parser.add_argument("--dsn", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.profile:
        parser.error("--profile: this benchmark has no profiled run (its time is in psycopg and the database)")
    if args.worker:
        import psycopg

        database = f"bench_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(args.dsn, autocommit=True) as admin:
            admin.execute(f"CREATE DATABASE {database}")
        dsn = f"{args.dsn.rsplit('/', 1)[0]}/{database}"  # the server's URI, another database
        print(json.dumps(_worker(dsn, args.operations, args.loop_busy)))
        return
    from waltz_common.testing.postgres import PostgresProcess

    server = PostgresProcess()
    dsn = server.start()
    try:
        title, runs = compare(args, "clients/python", "waltz_client", "bench.pg_helper",
                              ["--dsn", dsn, "--operations", str(args.operations), "--loop-busy", str(args.loop_busy)])
    finally:
        server.stop()
    print(f"{title}; {args.rounds} round(s) of {args.operations} operations each; loop busy {args.loop_busy:.0%}")
    print(f"{'operation':<20} {'baseline wall us':>17} {'candidate wall us':>18} {'ratio':>6}"
          f" {'baseline CPU us':>16} {'candidate CPU us':>17} {'ratio':>6}")
    for name, _, _ in OPERATIONS:
        base_wall = min(r["operations"][name]["wall"] for r in runs["baseline"]) * 1e6
        wall = min(r["operations"][name]["wall"] for r in runs["candidate"]) * 1e6
        base_cpu = min(r["operations"][name]["cpu"] for r in runs["baseline"]) * 1e6
        cpu = min(r["operations"][name]["cpu"] for r in runs["candidate"]) * 1e6
        print(f"{name:<20} {base_wall:>17,.0f} {wall:>18,.0f} {wall / base_wall:>6.2f}"
              f" {base_cpu:>16,.0f} {cpu:>17,.0f} {cpu / base_cpu:>6.2f}")


if __name__ == "__main__":
    main()
