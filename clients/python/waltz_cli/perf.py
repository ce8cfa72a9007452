"""`waltz perf produce` / `waltz perf consume`: load and measure a running cluster through the real client."""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import sys
import time
from collections.abc import Callable
from typing import Any

from waltz_cli import rpc
from waltz_cli.context import Context
from waltz_cli.errors import CliError, UsageError
from waltz_cli.output import Result, table
from waltz_cli.perf_stats import (
    OpenLoopSchedule,
    Recorder,
    Summary,
    header_age_s,
    progress_line,
    send_time_header,
)
from waltz_client import AsyncWaltzClient, PartitionLocalLock, Transaction, TransactionBuilder, TransactionContext
from waltz_client.api import WaltzClientCallbacks

LOCK_NAME = "waltz-perf"


def register(groups: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    """Add `perf produce` and `perf consume`."""
    parser = groups.add_parser("perf", help="measure a running cluster as a client", parents=[common])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    produce = sub.add_parser("produce", help="append transactions and measure commit rate and latency",
                             parents=[common])
    _partitions_and_duration(produce)
    produce.add_argument("--payload", type=int, default=512, metavar="BYTES", help="bytes per transaction (512)")
    load = produce.add_mutually_exclusive_group()
    load.add_argument("--rate", type=float, metavar="N", help="open loop: N appends/s in all on a fixed schedule "
                      "(latency from the scheduled time)")
    load.add_argument("--writers", type=int, metavar="N", help="closed loop: N writers, each waiting for its "
                      "commit before its next append (default 10)")
    produce.add_argument("--locks", action="store_true", help="each append takes a write lock on one of "
                         "--lock-keys keys (conflicts are lock failures, then retries)")
    produce.add_argument("--lock-keys", type=int, default=1000, metavar="N", help="lock keys to pick from (1000)")
    produce.add_argument("--max-pending", type=int, default=100, metavar="N",
                         help="appends in flight per partition (client.maxConcurrentTransactions, default 100)")
    produce.set_defaults(func=produce_cmd)
    consume = sub.add_parser("consume", help="follow the feed and measure apply rate and end-to-end latency",
                             parents=[common])
    _partitions_and_duration(consume)
    consume.add_argument("--count", type=int, metavar="N", help="stop after N transactions (default: at --duration)")
    consume.add_argument("--from-start", action="store_true",
                         help="replay each partition from transaction 0 (default: only transactions from now on)")
    consume.add_argument("--fetch-data", action="store_true",
                         help="also fetch every transaction's data, as an application reading others' data does")
    consume.set_defaults(func=consume_cmd)


def _partitions_and_duration(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-p", "--partitions", metavar="RANGES", help="partitions, e.g. 0-6,8 (default: all)")
    parser.add_argument("-d", "--duration", type=float, default=10.0, metavar="S", help="seconds to run (10)")


class _Callbacks(WaltzClientCallbacks):
    """Starts each partition where it asks; counts (and times) what the feed applies."""

    def __init__(self, start: dict[int, int], on_apply: Callable[[Transaction], None] | None = None) -> None:
        self.start = start
        self.on_apply = on_apply
        self.errors = 0

    def get_client_high_water_mark(self, partition_id: int) -> int:
        return self.start[partition_id]

    def apply_transaction(self, transaction: Transaction) -> None:
        if self.on_apply is not None:
            self.on_apply(transaction)

    def uncaught_exception(self, partition_id: int, transaction_id: int, exc: BaseException) -> None:
        self.errors += 1


class _Append(TransactionContext):
    def __init__(self, partition: int, payload: bytes, lock_key: int | None) -> None:
        self.partition, self.payload, self.lock_key = partition, payload, lock_key

    def partition_id(self, num_partitions: int) -> int:
        return self.partition

    def execute(self, builder: TransactionBuilder) -> bool:
        builder.set_header(send_time_header(time.time()))
        builder.data = self.payload
        if self.lock_key is not None:
            builder.set_write_locks([PartitionLocalLock(LOCK_NAME, self.lock_key)])
        return True


def _client_config(ctx: Context, **overrides: Any) -> dict[str, Any]:
    """The perf client's configuration: --server-addresses (client.servers) when given, else ZooKeeper."""
    if ctx.servers:
        where: dict[str, Any] = {"client.servers": list(ctx.servers)}
    else:
        ctx.paths  # a missing root is a usage error before anything starts  # noqa: B018
        if not ctx.connect_string:
            raise UsageError("no cluster given: use --server-addresses HOST:PORT,..., -c CLI.yaml, or "
                             "--zookeeper HOST:PORT --root /path")
        where = {"zookeeper.connectString": ctx.connect_string, "cluster.root": ctx.root,
                 "zookeeper.connectTimeoutSeconds": ctx.connect_timeout_s, **ctx.zookeeper_security_config()}
    return {**where, **ctx.tls_config(), "client.autoMount": False, "client.mountTimeout": max(ctx.rpc_timeout_s, 10.0),
            "client.requestTimeout": max(ctx.rpc_timeout_s, 30.0), **overrides}


class _Progress:
    """The live line on stderr, once a second, when shown (a terminal, or --progress)."""

    def __init__(self, ctx: Context, operation: str, duration: float) -> None:
        self.show = sys.stderr.isatty() if ctx.show_progress is None else ctx.show_progress
        self.operation, self.duration = operation, duration

    async def run(self, started: float, recorder: Recorder, done: Callable[[], int]) -> None:
        if not self.show:
            return
        try:
            while True:
                await asyncio.sleep(1.0)
                line = progress_line(self.operation, time.monotonic() - started, self.duration, done(),
                                     recorder.errors, recorder.recent_p99())
                print("\r" + line, end="", file=sys.stderr, flush=True)
        finally:
            print(file=sys.stderr, flush=True)


def _result(summary: Summary, describe: str) -> Result:
    text = table(Summary.HEADERS, [summary.row()]) + "\n" + describe
    if summary.error_kinds:
        text += "\nerrors: " + ", ".join(f"{k} x{n}" for k, n in sorted(summary.error_kinds.items()))
    return Result(summary.data(), text, 1 if summary.errors else 0)


def produce_cmd(ctx: Context, args: argparse.Namespace) -> Result:
    """Append for --duration seconds, open or closed loop; report rate and submit-to-commit latency."""
    if args.payload < 0 or args.duration <= 0 or args.max_pending < 1 or args.lock_keys < 1:
        raise UsageError("--payload must be >= 0, --duration > 0, --max-pending and --lock-keys >= 1")
    if args.writers is not None and args.writers < 1:
        raise UsageError("--writers must be at least 1")
    partitions = ctx.partitions(args.partitions)
    start = {pid: rpc.high_water_mark(ctx, pid) for pid in partitions}
    config = _client_config(ctx, **{"client.maxConcurrentTransactions": args.max_pending,
                                    "client.callbackThread": False})
    writers = args.writers if args.writers is not None or args.rate is not None else 10
    settings = {"partitions": partitions, "payload_bytes": args.payload, "duration_s": args.duration,
                "rate": args.rate, "writers": writers if args.rate is None else None, "locks": args.locks,
                "lock_keys": args.lock_keys if args.locks else None, "max_pending": args.max_pending}
    summary = asyncio.run(_produce(ctx, args, config, start, writers))
    summary.settings = settings
    mode = f"open loop at {args.rate:g}/s" if args.rate is not None else f"closed loop, {writers} writers"
    return _result(summary, f"produce: {mode}, {args.payload} B payloads, partitions {args.partitions or 'all'}, "
                            f"locks {'on' if args.locks else 'off'}; latency: submit (or scheduled time) to commit")


async def _produce(ctx: Context, args: argparse.Namespace, config: dict[str, Any], start: dict[int, int],
                   writers: int) -> Summary:
    partitions = sorted(start)
    payload = os.urandom(args.payload)
    rng = random.Random()
    recorder = Recorder()
    loop = asyncio.get_running_loop()

    def context(i: int) -> _Append:
        key = rng.randrange(args.lock_keys) if args.locks else None
        return _Append(partitions[i % len(partitions)], payload, key)

    def finish(sent_at: float) -> Callable[[asyncio.Future[bool]], None]:
        def done(future: asyncio.Future[bool]) -> None:
            exc = future.exception()
            if exc is not None:
                recorder.failed(exc)
            else:
                recorder.ok(loop.time() - sent_at)
        return done

    async with AsyncWaltzClient(_Callbacks(start), config) as client:
        client.mount_partitions(partitions)
        await client.wait_mounted()
        began = loop.time()
        deadline = began + args.duration
        progress = asyncio.ensure_future(_Progress(ctx, "produce", args.duration).run(
            time.monotonic(), recorder, lambda: recorder.count))
        try:
            if args.rate is not None:
                schedule = OpenLoopSchedule(args.rate, began)
                sent = 0
                while (now := loop.time()) < deadline:
                    for due in schedule.take(now):
                        try:
                            future = await client.submit(context(sent))
                        except Exception as exc:
                            recorder.failed(exc)
                            continue
                        future.add_done_callback(finish(due))
                        sent += 1
                    await asyncio.sleep(max(0.0, min(schedule.next_due(), deadline) - loop.time()))
            else:
                counter = iter(range(1 << 62))

                async def writer() -> None:
                    while loop.time() < deadline:
                        sent_at = loop.time()
                        try:
                            future = await client.submit(context(next(counter)))
                            await future
                        except Exception as exc:
                            recorder.failed(exc)
                            await asyncio.sleep(0.05)  # a client that refuses everything must not spin
                            continue
                        recorder.ok(loop.time() - sent_at)

                await asyncio.gather(*(writer() for _ in range(writers)))
            await client.flush()
            elapsed = loop.time() - began
        finally:
            progress.cancel()
            await asyncio.gather(progress, return_exceptions=True)
        return Summary.of("produce", recorder, elapsed, {}, lock_failures=client.stats.lock_failures)


def consume_cmd(ctx: Context, args: argparse.Namespace) -> Result:
    """Follow the feed for --duration (or --count transactions); report rate and send-to-apply latency."""
    if args.duration <= 0 or (args.count is not None and args.count < 1):
        raise UsageError("--duration must be > 0 and --count at least 1")
    partitions = ctx.partitions(args.partitions)
    start = {pid: -1 if args.from_start else rpc.high_water_mark(ctx, pid) for pid in partitions}
    config = _client_config(ctx, **{"client.callbackThread": bool(args.fetch_data)})
    summary = asyncio.run(_consume(ctx, args, config, start))
    summary.settings = {"partitions": partitions, "duration_s": args.duration, "count": args.count,
                        "from_start": args.from_start, "fetch_data": args.fetch_data}
    return _result(summary, f"consume: partitions {args.partitions or 'all'}, "
                            f"{'from transaction 0' if args.from_start else 'from now on'}"
                            f"{', fetching data' if args.fetch_data else ''}; latency: the header's send time "
                            "(written by perf produce, wall clock) to the apply, for transactions sent since the start")


async def _consume(ctx: Context, args: argparse.Namespace, config: dict[str, Any], start: dict[int, int]) -> Summary:
    loop = asyncio.get_running_loop()
    recorder = Recorder()
    applied = 0
    began_wall = time.time()
    began = reached_at = time.monotonic()  # from the mount on: a replay's catch-up comes with the mount
    enough = asyncio.Event()

    def on_apply(transaction: Transaction) -> None:  # on the loop, or the callback thread with --fetch-data
        nonlocal applied, reached_at
        if args.count is not None and applied >= args.count:
            return  # counted enough: the rest of a replay batch
        if args.fetch_data:
            transaction.data()
        now = time.time()
        age = header_age_s(transaction.header, now)
        if age <= now - began_wall + 1.0:  # sent since the start (1 s for clocks): a live transaction
            recorder.ok(age)
        applied += 1
        if applied == args.count:
            reached_at = time.monotonic()
            loop.call_soon_threadsafe(enough.set)

    callbacks = _Callbacks(start, on_apply)
    async with AsyncWaltzClient(callbacks, config) as client:
        progress = asyncio.ensure_future(_Progress(ctx, "consume", args.duration).run(
            began, recorder, lambda: applied))
        try:
            client.mount_partitions(sorted(start))
            async with asyncio.timeout(args.duration):
                await client.wait_mounted()  # WaltzTimeoutError (client.mountTimeout) if it cannot be
                await enough.wait()
        except TimeoutError:
            reached_at = time.monotonic()
        finally:
            progress.cancel()
            await asyncio.gather(progress, return_exceptions=True)
    recorder.errors += callbacks.errors
    if args.count is not None and applied < args.count:
        raise CliError(f"consume: only {applied} of {args.count} transactions arrived in {args.duration:g} s")
    return Summary.of("consume", recorder, reached_at - began, {}, transactions=applied)
