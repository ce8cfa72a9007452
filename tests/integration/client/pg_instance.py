"""One application instance for the PostgreSQL exactly-once test, run as its own process (so it can be
killed with kill -9): applies the feed into a shared journal and submits COUNT transactions NAME-i.

Usage: python pg_instance.py DSN CLIENT.yaml NAME COUNT. Prints `committed N` as it goes, then `hwm P H` per
partition, `applied N in B batches` and `done` once it has applied everything up to the servers' high-water marks.
"""

from __future__ import annotations

import sys
import time

from waltz_client import Transaction, TransactionBuilder, TransactionContext, WaltzClient
from waltz_client.postgres_callbacks import PgGuardedConnection, PostgresClientCallbacks


class Journal(PostgresClientCallbacks):
    """A row per apply and no unique key: a transaction applied twice shows as two rows."""

    def create_schema(self, connection: PgGuardedConnection) -> None:
        connection.execute("CREATE TABLE IF NOT EXISTS journal (partition_id INTEGER, transaction_id BIGINT, "
                           "data TEXT, applied_by TEXT)")

    def apply(self, transaction: Transaction, connection: PgGuardedConnection) -> None:
        connection.execute("INSERT INTO journal VALUES (%s, %s, %s, %s)", (
            transaction.partition_id, transaction.transaction_id, transaction.data().decode(), sys.argv[3]))


class Append(TransactionContext):
    def __init__(self, data: str, partition: int) -> None:
        self.data, self.partition = data, partition

    def partition_id(self, num_partitions: int) -> int:
        return self.partition % num_partitions

    def execute(self, builder: TransactionBuilder) -> bool:
        builder.set_data(self.data.encode())
        return True


def main() -> int:
    dsn, config, name, count = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    journal = Journal(dsn)
    with WaltzClient(journal, config) as client:
        client.wait_mounted()
        committed = 0
        for start in range(0, count, 5):
            futures = [client.submit(Append(f"{name}-{i}", i)) for i in range(start, min(count, start + 5))]
            committed += sum(1 for f in futures if f.result(timeout=120))
            print(f"committed {committed}", flush=True)
            time.sleep(0.02)
        client.flush()
        hwms = {p: client.high_water_mark(p) for p in range(client.num_partitions)}
        deadline = time.monotonic() + 120
        while any(client.client_high_water_mark(p) < h for p, h in hwms.items()):
            if time.monotonic() > deadline:
                print("not caught up", flush=True)
                return 1
            time.sleep(0.02)
        for p, h in hwms.items():
            print(f"hwm {p} {h}", flush=True)
        print(f"applied {client.stats.applied} in {client.stats.apply_batches} batches", flush=True)
    journal.close()
    print("done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
