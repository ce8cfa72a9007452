"""`waltz client validate`: producers append under one shared write lock; consumers check data == transaction id.

Each producer's transaction carries, as its data, the producer's client high-water mark + 1, and every
transaction takes the same write lock. A transaction can only commit if no other transaction committed
after the high-water mark its producer built it against (otherwise the lock fails and it is rebuilt), so
its id must be exactly that mark + 1. Consumers read every new transaction and check data == id: a stale
writer that slipped past the locks would show up as a mismatch.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from waltz_cli import rpc
from waltz_cli.context import Context
from waltz_cli.errors import CliError, UsageError
from waltz_cli.output import Counter, Result, table

LOCK_NAME = "waltz-validate"

ClientFactory = Callable[[Any], Any]
"""callbacks -> a started blocking WaltzClient (the CLI's connects to the cluster; tests pass a mock)."""


@dataclass
class Tally:
    """What the run observed, shared by every client's callback thread."""

    start: int
    lock: threading.Lock = field(default_factory=threading.Lock)
    lock_failures: int = 0
    consumed: dict[int, int] = field(default_factory=dict)  # consumer -> transactions checked
    mismatches: list[str] = field(default_factory=list)

    def add_lock_failure(self) -> None:
        with self.lock:
            self.lock_failures += 1


class _Callbacks:
    """Applies transactions in order from a start mark; consumers also check each one's data."""

    def __init__(self, partition: int, tally: Tally, consumer: int | None, progress: Counter | None) -> None:
        self.partition, self.tally, self.consumer, self.progress = partition, tally, consumer, progress
        self.high_water_mark = tally.start
        self.reached = threading.Condition()

    def get_client_high_water_mark(self, partition_id: int) -> int:
        return self.high_water_mark

    def apply_transaction(self, transaction: Any) -> None:
        if self.consumer is not None:
            data = transaction.data()
            if data != str(transaction.transaction_id).encode():
                with self.tally.lock:
                    self.tally.mismatches.append(f"transaction {transaction.transaction_id} holds {data[:40]!r}")
            with self.tally.lock:
                self.tally.consumed[self.consumer] = self.tally.consumed.get(self.consumer, 0) + 1
            if self.progress is not None:
                self.progress.update(1)
        with self.reached:
            self.high_water_mark = transaction.transaction_id
            self.reached.notify_all()

    def uncaught_exception(self, partition_id: int, transaction_id: int, exc: BaseException) -> None:
        with self.tally.lock:
            self.tally.mismatches.append(f"transaction {transaction_id}: {type(exc).__name__}: {exc}")

    def wait_for(self, mark: int, timeout: float) -> bool:
        with self.reached:
            return self.reached.wait_for(lambda: self.high_water_mark >= mark, timeout)


def _context(partition: int, tally: Tally) -> Any:
    from waltz_client import PartitionLocalLock, TransactionContext

    class ValidationContext(TransactionContext):
        """Data = the producer's client high-water mark + 1, under the shared write lock."""

        def partition_id(self, num_partitions: int) -> int:
            return partition

        def execute(self, builder: Any) -> bool:
            builder.set_data(str(builder.client_high_water_mark + 1).encode())
            builder.set_write_locks([PartitionLocalLock(LOCK_NAME, 0)])
            return True

        def on_lock_failure(self) -> None:
            tally.add_lock_failure()

    return ValidationContext()


def run(
    make_client: ClientFactory,
    partition: int,
    start: int,
    producers: int,
    consumers: int,
    per_producer: int,
    deadline_s: float,
    show_progress: bool | None,
) -> dict[str, Any]:
    """Run the workload from the partition's high-water mark start; returns what was seen."""
    tally = Tally(start)
    total = producers * per_producer
    end_by = time.monotonic() + deadline_s
    clients: list[Any] = []
    with Counter(total * max(consumers, 1), "validate", show_progress) as bar:
        try:
            watchers = [_Callbacks(partition, tally, i, bar) for i in range(consumers)]
            clients += [make_client(cb) for cb in watchers]
            writers = [_Callbacks(partition, tally, None, None) for _ in range(producers)]
            clients += [make_client(cb) for cb in writers]

            def produce(client: Any) -> list[concurrent.futures.Future[bool]]:
                return [client.submit(_context(partition, tally)) for _ in range(per_producer)]

            with concurrent.futures.ThreadPoolExecutor(max_workers=max(producers, 1)) as pool:
                submitted = [f for fs in pool.map(produce, clients[consumers:]) for f in fs]
            outcomes = concurrent.futures.wait(submitted, timeout=max(0.0, end_by - time.monotonic()))
            committed = sum(1 for f in outcomes.done if not f.exception() and f.result())
            errors = [str(f.exception()) for f in outcomes.done if f.exception()]
            target = start + committed
            caught_up = all(w.wait_for(target, max(0.0, end_by - time.monotonic())) for w in watchers)
        finally:
            for client in clients:
                client.close()
    return {
        "partition": partition,
        "start_high_water_mark": start,
        "submitted": total,
        "committed": committed,
        "pending": len(outcomes.not_done),
        "errors": errors[:10],
        "lock_failures": tally.lock_failures,
        "consumed": {str(k): v for k, v in sorted(tally.consumed.items())},
        "consumers_caught_up": caught_up,
        "mismatches": tally.mismatches[:20],
        "passed": not tally.mismatches and committed == total and caught_up,
    }


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    """Add `client validate`."""
    p = sub.add_parser("validate", help="prove the write lock stops stale writers", parents=[common])
    p.add_argument("-n", "--transactions", type=int, default=100, help="transactions per producer (default 100)")
    p.add_argument("--producers", type=int, default=2, help="producer clients (default 2)")
    p.add_argument("--consumers", type=int, default=1, help="consumer clients (default 1)")
    p.add_argument("-p", "--partition", type=int, default=0, help="the partition to use (default 0)")
    p.add_argument("--max-seconds", type=float, default=600.0, help="give up after this long (default 600)")
    p.set_defaults(func=validate_cmd)


def cluster_clients(ctx: Context, partition: int) -> ClientFactory:
    """A factory of real clients of ctx's cluster that mount only the partition."""
    from waltz_client import WaltzClient

    where: dict[str, Any] = {"client.servers": list(ctx.servers)} if ctx.servers else {
        "zookeeper.connectString": ctx.connect_string,
        "zookeeper.connectTimeoutSeconds": ctx.connect_timeout_s,
        "zookeeper.sessionTimeoutSeconds": ctx.session_timeout_s,
        "cluster.root": ctx.paths.root,
        **ctx.zookeeper_security_config(),
    }
    config = {**where, "client.autoMount": False, "client.requestTimeout": ctx.rpc_timeout_s, **ctx.tls_config()}

    def make(callbacks: Any) -> Any:
        client = WaltzClient(callbacks, config)
        try:
            client.mount_partitions([partition])
            client.wait_mounted()
        except BaseException:
            client.close()
            raise
        return client

    return make


def validate_cmd(ctx: Context, args: argparse.Namespace) -> Result:
    """Run the validation workload against the cluster; exit 1 unless it passed."""
    if args.producers < 1 or args.consumers < 1 or args.transactions < 1:
        raise UsageError("--producers, --consumers and --transactions must each be at least 1")
    pid = ctx.partitions(str(args.partition))[0]
    try:
        start = rpc.high_water_mark(ctx, pid)
        data = run(
            cluster_clients(ctx, pid),
            pid,
            start,
            args.producers,
            args.consumers,
            args.transactions,
            args.max_seconds,
            ctx.show_progress,
        )
    except Exception as exc:
        if type(exc).__module__.startswith("waltz_client"):
            raise CliError(f"client validate: {exc}") from None
        raise
    rows = [[k.replace("_", " "), v] for k, v in data.items() if k not in ("mismatches", "errors")]
    text = table(["", "value"], rows)
    text += "".join(f"\nmismatch: {m}" for m in data["mismatches"]) + "".join(f"\nerror: {e}" for e in data["errors"])
    text += "\nPASSED" if data["passed"] else "\nFAILED"
    return Result(data, text, 0 if data["passed"] else 1)
