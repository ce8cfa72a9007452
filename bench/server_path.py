"""The server's append path on its own: CPU per committed append, next to a baseline revision in the same run.

    python -m bench.server_path [--baseline REV] [--rounds N] [--messages N] [--batch-size N] [--locks] [--profile]

No network and no storage node: what a server does with the appends of a writer process at 100 writers, in one
process. Each round trip is what the append benchmark's closed loop does once per batch: a serialized
ClientMessage of --batch-size appends (512 B of data each, one client, as an AsyncWaltzClient with that many
transactions in flight sends them) parsed as gRPC's deserializer does (ClientMessage.FromString), dispatched by the
server's own ClientStream to a real Partition (validation, the append pipeline and its lock checks, the store
batches, the feed message, the settle with its data cache, re-send window and metrics); the store is in memory but
encodes each batch as a storage request and serializes it as the real store session does (store.wire, then
SerializeToString once for every replica), and commits it on the next turn of the loop; the ClientStream's writer
serializes every answer as the gRPC stream does (coalesce, stream_answer). The next message goes once the feed
carried the previous one's appends. What is left out is the transport's cost per message (gRPC's and the framed
port's writes and reads, the kernel's): the benchmark measures the per-append Python that a batch does not share.
--locks gives every append one write lock and one read lock of its own (no conflicts).

The baseline is another revision's server package (default: git merge-base HEAD main), exported with `git archive`
and put first on PYTHONPATH of its worker processes; the rest (protos, common, this benchmark) is this checkout's.
Each round runs one worker per revision, alternating which goes first; the table shows the best of the rounds (a
busy machine only ever adds time) and the ratio. Process CPU time per append is the figure a busy machine
disturbs least. --profile runs the candidate once under cProfile (CPU time) and prints its top functions.
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

CLIENT_ID = 1
PARTITION = 0
RECORD_BYTES = 512
TREE = "services/server"


def build_messages(count: int, batch_size: int, locks: bool) -> list[bytes]:
    """count serialized ClientMessages of batch_size appends each, seq_num 1.. in order, each message's appends
    with the client high-water mark that the feed of the messages before it gave (the closed loop's)."""
    from waltz.v1 import common_pb2, server_pb2
    from waltz_common.types import crc32

    data = os.urandom(RECORD_BYTES)
    checksum = crc32(data)
    messages = []
    for m in range(count):
        batch = server_pb2.AppendBatch()
        for i in range(batch_size):
            seq = m * batch_size + i + 1
            request = batch.requests.add()
            request.req_id.CopyFrom(common_pb2.ReqId(client_id=CLIENT_ID, generation=1, partition_id=PARTITION,
                                                     seq_num=seq))
            request.client_high_water_mark = m * batch_size - 1
            request.header = seq & 0xFF
            request.data_length = len(data)
            request.data = data
            request.checksum = checksum
            if locks:
                request.write_locks.append(seq)
                request.write_lock_request_length = 1
                request.read_locks.append(-seq)
                request.read_lock_request_length = 1
        messages.append(server_pb2.ClientMessage(appends=batch).SerializeToString())
    return messages


def _storage_request() -> Any:
    """The function the revision's store session builds an append's storage request with."""
    from waltz_server.store import store_session, wire

    return getattr(store_session, "storage_append_request", wire.append_pending_request)


class _MemoryStore:
    """A StorePartition in memory: each batch is encoded and serialized as the store session sends it to its
    replicas, and commits on the next turn of the loop."""

    partition_id = PARTITION
    on_fenced = None

    def __init__(self) -> None:
        self.high_water_mark = -1
        self._next = 0
        self.encoded_bytes = 0

    async def start(self, generation: int) -> None:
        pass

    async def set_generation(self, generation: int) -> None:
        pass

    async def wait_ready(self, timeout: float | None = None) -> None:
        pass

    async def begin_append(self, records: Any) -> asyncio.Future[int]:
        return self.append_now(records)

    def append_now(self, records: Any) -> asyncio.Future[int]:
        first, self._next = self._next, self._next + len(records)
        request = _storage_request()(7, PARTITION, first, records, self.high_water_mark)
        self.encoded_bytes += len(request.SerializeToString())
        done: asyncio.Future[int] = asyncio.get_running_loop().create_future()

        def commit() -> None:
            self.high_water_mark = first + len(records) - 1
            done.set_result(first)

        asyncio.get_running_loop().call_soon(commit)
        return done

    async def get_headers(self, transaction_id: int, max_records: int) -> list[Any]:
        return []

    def status(self) -> Any:
        from waltz_server.store.api import StoreStatus

        return StoreStatus(7, self.high_water_mark, True, "ok", 3, 3, 3)

    async def close(self) -> None:
        pass


class _Context:
    """The gRPC stream as ClientStream.write uses it: every answer serialized, the feed's entries counted."""

    def __init__(self) -> None:
        from waltz.v1 import server_pb2

        self.fed = -1  # the last transaction id fed
        self.answers = 0  # other messages: the mount's answer (anything else is an error)
        self.error = ""
        self.changed = asyncio.Event()
        self._parse = server_pb2.ServerMessage.FromString

    async def write(self, payload: Any) -> None:
        from waltz_server.client_stream import stream_answer

        data = stream_answer(payload)
        message = payload if not isinstance(payload, bytes) else self._parse(data)
        if message.WhichOneof("message") == "feed":
            self.fed = message.feed.transactions[-1].transaction_id
        else:
            self.answers += 1
            if message.WhichOneof("message") != "mount":
                self.error = f"the benchmark's appends were answered {message}"
        self.changed.set()


async def run_once(messages: list[bytes], batch_size: int) -> tuple[int, float, float]:
    """Every message through the server's append path: (appends committed, wall seconds, CPU seconds)."""
    from prometheus_client import CollectorRegistry

    from waltz.v1 import server_pb2
    from waltz_server.client_stream import ClientStream
    from waltz_server.config import PartitionSettings
    from waltz_server.metrics import ServerMetrics
    from waltz_server.partition import Partition

    store = _MemoryStore()
    metrics = ServerMetrics(CollectorRegistry())
    partition = Partition(PARTITION, 1, store, PartitionSettings(), metrics.for_partition(PARTITION))  # type: ignore[arg-type]
    await partition.open()
    await partition.wait_ready(10)

    class Manager:
        num_partitions = 1

        def get(self, pid: int) -> Partition | None:
            return partition if pid == PARTITION else None

    stream = ClientStream(Manager(), 1, 1000, 5000)  # type: ignore[arg-type]
    context = _Context()
    writer = asyncio.get_running_loop().create_task(stream.write(context))
    decode = server_pb2.ClientMessage.FromString
    mount = server_pb2.ClientMessage()
    mount.mount.req_id.client_id = CLIENT_ID
    mount.mount.req_id.generation = 1
    mount.mount.req_id.partition_id = PARTITION
    mount.mount.client_high_water_mark = -1
    mount.mount.seq_num = 1
    await stream.dispatch(mount)
    while not context.answers:
        context.changed.clear()
        await context.changed.wait()
    try:
        wall, cpu = time.perf_counter(), time.process_time()
        for number, raw in enumerate(messages):
            message = decode(raw)
            await stream.dispatch(message)
            target = (number + 1) * batch_size - 1
            while context.fed < target:
                if context.error:
                    raise AssertionError(context.error)
                context.changed.clear()
                await context.changed.wait()
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    finally:
        writer.cancel()
        await partition.close()
    if context.fed != len(messages) * batch_size - 1 or store.high_water_mark != context.fed:
        raise AssertionError("not every append was committed and fed once")
    return context.fed + 1, wall, cpu


def worker(args: argparse.Namespace) -> None:
    from waltz_common import event_loop
    from waltz_common.gctune import tune_for_service

    tune_for_service()  # as the server does
    messages = build_messages(args.messages, args.batch_size, args.locks)
    event_loop.run(run_once(messages[: max(1, len(messages) // 10)], args.batch_size))  # warm up: imports
    if args.profile:
        profile = cProfile.Profile(time.process_time)
        profile.enable()
        event_loop.run(run_once(messages, args.batch_size))
        profile.disable()
        pstats.Stats(profile).sort_stats("tottime").print_stats(30)
        return
    committed, wall, cpu = event_loop.run(run_once(messages, args.batch_size))
    import waltz_server

    package = str(Path(waltz_server.__file__).parent)
    print(json.dumps({"committed": committed, "wall": wall, "cpu": cpu, "package": package}))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=300, help="client messages per run")
    parser.add_argument("--batch-size", type=int, default=100, help="appends per client message")
    parser.add_argument("--locks", action="store_true", help="every append takes a write and a read lock")
    package_baseline.add_arguments(parser)
    args = parser.parse_args(argv)
    if args.worker or args.profile:
        worker(args)
        return
    arguments = ["--messages", str(args.messages), "--batch-size", str(args.batch_size)] + (
        ["--locks"] if args.locks else [])
    names, runs = package_baseline.compare(args, TREE, "waltz_server", "bench.server_path", arguments)
    appends = args.messages * args.batch_size
    locks = "one write and one read lock each" if args.locks else "no locks"
    print(f"server append path: {args.messages} client messages x {args.batch_size} appends = {appends:,} per run "
          f"({RECORD_BYTES} B, {locks}), {args.rounds} rounds, best; load average {os.getloadavg()[0]:.2f}")
    print(names)
    package_baseline.print_table(runs, "committed", "append", "appends")


if __name__ == "__main__":
    main()
