"""CPU of settling a committed batch on the server, per append: once per append (the baseline) against once per
batch, in the same run.

    .venv/bin/python -m bench.settle_bench [--batch N] [--clients C] [--rounds R] [--appends A]

What Partition._settle does with each committed batch besides its feed: resolve the appends' tickets (issue 24's
ClientPending), put their data in the data cache (charging the server's cache budget), observe their commit
latency. The baseline does each once per append, as the server did before (ClientPending.resolved, DataCache.put,
BatchHistogram.observe_many of one latency per append); the candidate once per batch (resolved_all, put_many,
observe_counted of one latency per run of appends that arrived together). C clients share a batch of N appends,
each client's appends consecutive (as one client message arrives), with a flush waiting on every client. CPU time
(time.process_time), the best of R rounds, so a busy machine inflates both alike. Prints a table; asserts nothing.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from dataclasses import dataclass

from waltz_common.types import Record, ReqId
from waltz_server.append_pipeline import ClientPending
from waltz_server.cache_budget import CacheBudget
from waltz_server.caches import DataCache
from waltz_server.metrics import BatchHistogram

RECORD_BYTES = 512


@dataclass(slots=True)
class _Append:
    client_id: int
    ticket: int
    arrived: float
    size: int
    record: Record


def _batches(count: int, size: int, clients: int, pending: ClientPending[Callable[[], None]]) -> list[list[_Append]]:
    data = b"x" * RECORD_BYTES
    batches = []
    for b in range(count):
        batch = []
        for i in range(size):
            client = i * clients // size
            arrived = float(b * clients + client)  # one arrival time per client message
            record = Record(b * size + i, ReqId(client, 1, 0, i), 0, data, 0)
            batch.append(_Append(client, pending.offered(client), arrived, RECORD_BYTES, record))
        batches.append(batch)
    return batches


def _settle_per_append(batch: list[_Append], first: int, now: float, pending: ClientPending[Callable[[], None]],
                       cache: DataCache, latency: BatchHistogram) -> None:
    put = cache.put
    for offset, item in enumerate(batch):
        put(first + offset, item.record, item.size)
    latency.observe_many([now - item.arrived for item in batch])
    resolve = pending.resolved
    for item in batch:
        for waiter in resolve(item.client_id, item.ticket):
            waiter()


def _settle_per_batch(batch: list[_Append], first: int, now: float, pending: ClientPending[Callable[[], None]],
                      cache: DataCache, latency: BatchHistogram) -> None:
    entries = []
    latencies = []
    arrived, run = batch[0].arrived, 0
    for item in batch:
        entries.append((item.record, item.size))
        if item.arrived != arrived:
            latencies.append((now - arrived, run))
            arrived, run = item.arrived, 0
        run += 1
    latencies.append((now - arrived, run))
    cache.put_many(first, entries)
    latency.observe_counted(latencies)
    for waiter in pending.resolved_all(batch):
        waiter()


def measure(settle: Callable[..., None], batch_size: int, clients: int, batches: int) -> float:
    """CPU microseconds per append of settling `batches` batches."""
    pending: ClientPending[Callable[[], None]] = ClientPending()
    cache = DataCache(64 * 2**20, CacheBudget(256 * 2**20))
    latency = BatchHistogram("latency_seconds", "commit latency", (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1))
    work = _batches(batches, batch_size, clients, pending)
    answered = 0

    def answer() -> None:
        nonlocal answered
        answered += 1

    for client in range(clients):
        pending.add_waiter(client, answer)
    started = time.process_time()
    for b, batch in enumerate(work):
        settle(batch, b * batch_size, b * clients + 0.5, pending, cache, latency)
    spent = time.process_time() - started
    if answered != clients:
        raise RuntimeError(f"{answered} of {clients} waiters answered")
    return spent / (batches * batch_size) * 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench.settle_bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=100, help="appends per committed batch (default 100)")
    parser.add_argument("--clients", type=int, default=1, help="clients sharing a batch (default 1)")
    parser.add_argument("--rounds", type=int, default=5, help="rounds of each, alternating; the best counts")
    parser.add_argument("--appends", type=int, default=200_000, help="appends settled per round (default 200,000)")
    args = parser.parse_args(argv)
    count = max(10, args.appends // args.batch)
    head = f"{'batch':>6} {'clients':>8} | {'per append (baseline)':>22} {'per batch':>10} | {'ratio':>6}"
    print(f"CPU microseconds per append to settle a committed batch ({count:,} batches, best of {args.rounds})")
    print(head)
    print("-" * len(head))
    shapes = [(10, 1), (100, 1), (100, 10), (500, 5)]
    if (args.batch, args.clients) not in shapes:
        shapes.insert(0, (args.batch, args.clients))
    for size, clients in shapes:
        best = {"per append": float("inf"), "per batch": float("inf")}
        n = max(10, args.appends // size)
        for round_ in range(args.rounds):
            order = [("per append", _settle_per_append), ("per batch", _settle_per_batch)]
            for name, settle in order if round_ % 2 == 0 else order[::-1]:
                best[name] = min(best[name], measure(settle, size, clients, n))
        print(f"{size:>6} {clients:>8} | {best['per append']:>22.2f} {best['per batch']:>10.2f} | "
              f"{best['per batch'] / best['per append']:>6.2f}")
    print("ratio: per batch / per append (lower is better). The settle's record of the re-send window (one entry per "
          "append) is the same in both and left out.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
