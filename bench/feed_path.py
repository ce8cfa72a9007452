"""The Python client's feed path on its own: entries/s and CPU per entry, next to a baseline revision in the same run.

    python -m bench.feed_path [--baseline REV] [--rounds N] [--messages N] [--batch-size N] [--profile]

No cluster and no network: prebuilt feed messages (serialized ServerMessage/FeedDataBatch, one partition,
--batch-size entries each, every one another client's append, as a client catching up from transaction 0 gets
them) go through what the client does with a message from its stream: the gRPC deserializer
(ServerMessage.FromString), ClientPartition.deliver, its inbox and serve loop, the feed decisions (_on_feed), the
steps on a real callback thread (FeedSteps), settling (_settle) and stats. The application applies every
transaction into a list (apply_transaction: the per-transaction path, as bench.append_bench's feed row's): its id, as
an application keeps its state and drops the Transaction; --keep-transactions keeps the Transaction objects
themselves, where the garbage collector's passes over the growing heap become the largest cost.

The baseline is another revision's client package (default: where this branch left main, `git merge-base HEAD
main`), exported with `git archive` and put first on PYTHONPATH of its worker processes; the rest (protos, common)
is this checkout's. Each round runs one worker process per revision, alternating which goes first; the table shows
the best of the rounds (a busy machine only ever adds time) and the candidate/baseline ratio. Process CPU time (all
threads) per entry is the number that a busy machine disturbs least. --profile runs the candidate once under cProfile
(CPU time) and prints its top functions.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import os
import pstats
import time
from pathlib import Path
from typing import Any

from bench import package_baseline

OTHER_CLIENT = 7  # the writer of every fed transaction: not the benchmark's client
CLIENT_ID = 1
PARTITION = 0
TREE = "clients/python"


def build_messages(count: int, batch_size: int) -> list[bytes]:
    """count serialized feed messages of batch_size consecutive transactions from 0, all of OTHER_CLIENT."""
    from waltz.v1 import common_pb2, server_pb2

    messages = []
    for m in range(count):
        batch = server_pb2.FeedDataBatch()
        for txn_id in range(m * batch_size, (m + 1) * batch_size):
            batch.transactions.append(server_pb2.FeedData(
                req_id=common_pb2.ReqId(client_id=OTHER_CLIENT, generation=1, partition_id=PARTITION, seq_num=txn_id),
                transaction_id=txn_id, header=txn_id & 0xFF))
        messages.append(server_pb2.ServerMessage(feed=batch).SerializeToString())
    return messages


class _Conn:
    """The stream as the partition sees it while fed: nothing is sent."""

    closed = False
    endpoint = "bench:1"
    seq_num = 0

    def enqueue(self, message: object) -> None:
        pass


async def feed_once(messages: list[bytes], on_loop: bool = False,
                    keep_transactions: bool = False) -> tuple[int, float, float]:
    """Push every message through a ClientPartition: (transactions applied, wall seconds, CPU seconds). on_loop:
    the callbacks run on the event loop (client.callbackThread false), as the profile wants them (one thread)."""
    from waltz.v1 import server_pb2
    from waltz_client.api import Transaction, WaltzClientCallbacks
    from waltz_client.config import ClientConfig
    from waltz_client.partition import ClientPartition
    from waltz_client.partition_env import PartitionEnv
    from waltz_client.tasks import CallbackThread, LoopCallbacks
    from waltz_common.topology import Ownership

    class ListCallbacks(WaltzClientCallbacks):
        def __init__(self) -> None:
            self.applied: list[Any] = []

        def get_client_high_water_mark(self, partition_id: int) -> int:
            return -1

        def apply_transaction(self, transaction: Transaction) -> None:
            self.applied.append(transaction if keep_transactions else transaction.transaction_id)

    def no_fetch(partition_id: int, transaction_id: int) -> bytes:
        raise AssertionError("the benchmark's application reads no data")

    callbacks = ListCallbacks()
    thread = LoopCallbacks() if on_loop else CallbackThread("bench-feed-callbacks")
    owner = Ownership("bench:1", 1)
    topology = asyncio.Event()
    config = ClientConfig.of({"client.servers": ["bench:1"]}, zookeeper_required=False)
    env = PartitionEnv(client_id=CLIENT_ID, config=config, callbacks=callbacks, call=thread.call,
                       call_first=thread.call_first, post=thread.post, connections=None,  # type: ignore[arg-type]
                       ownership=lambda pid: owner, topology_changed=lambda: topology, fetch=no_fetch)
    partition = ClientPartition(PARTITION, env)
    conn: Any = _Conn()
    partition.conn = conn
    decode = server_pb2.ServerMessage.FromString
    try:
        wall, cpu = time.perf_counter(), time.process_time()
        serving = asyncio.get_running_loop().create_task(partition._serve(conn, owner))
        for raw in messages:
            if (waiting := partition.deliver(conn, decode(raw))) is not None:  # (None: taken at once)
                await waiting
        if (waiting := partition.deliver(conn, None)) is not None:  # the stream's end: the serve loop returns
            await waiting  # after the rest of its inbox
        await serving
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    finally:
        thread.shutdown()
    applied = [t.transaction_id for t in callbacks.applied] if keep_transactions else callbacks.applied
    if applied != list(range(len(applied))) or partition.client_high_water_mark != len(
            applied) - 1:
        raise AssertionError("the feed was not applied in order, once each")
    return len(applied), wall, cpu


def worker(args: argparse.Namespace) -> None:
    messages = build_messages(args.messages, args.batch_size)
    keep = args.keep_transactions
    asyncio.run(feed_once(messages[: max(1, len(messages) // 10)], keep_transactions=keep))  # warm up: imports
    if args.profile:
        profile = cProfile.Profile(time.thread_time)  # CPU time: the waits of a busy machine left out
        profile.enable()
        asyncio.run(feed_once(messages, on_loop=True, keep_transactions=keep))
        profile.disable()
        pstats.Stats(profile).sort_stats("tottime").print_stats(25)
        return
    applied, wall, cpu = asyncio.run(feed_once(messages, keep_transactions=keep))
    import waltz_client

    package = str(Path(waltz_client.__file__).parent)
    print(json.dumps({"applied": applied, "wall": wall, "cpu": cpu, "package": package}))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=400, help="feed messages per run")
    parser.add_argument("--batch-size", type=int, default=250, help="entries per feed message")
    parser.add_argument("--keep-transactions", action="store_true",
                        help="the application keeps the Transaction objects (not only their ids)")
    package_baseline.add_arguments(parser)
    args = parser.parse_args(argv)
    if args.worker or args.profile:
        worker(args)
        return
    arguments = ["--messages", str(args.messages), "--batch-size", str(args.batch_size)] + (
        ["--keep-transactions"] if args.keep_transactions else [])
    names, runs = package_baseline.compare(args, TREE, "waltz_client", "bench.feed_path", arguments)
    entries = args.messages * args.batch_size
    kept = "Transaction objects" if args.keep_transactions else "ids"
    print(f"feed path: {args.messages} messages x {args.batch_size} entries = {entries:,} transactions per run "
          f"(the application keeps their {kept}), "
          f"{args.rounds} rounds, best; load average {os.getloadavg()[0]:.2f}")
    print(names)
    package_baseline.print_table(runs, "applied", "entry", "entries")

if __name__ == "__main__":
    main()
