"""A partition's feed messages before their apply: those queued behind one merged into one batch, and the data
of other clients' transactions (fetched on the callback thread, or read ahead on the loop)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from itertools import islice
from typing import Any

from waltz.v1 import server_pb2
from waltz_client.api import FedTransaction, Transaction
from waltz_client.batch_data import READ_CHUNK, BatchData
from waltz_client.feed_steps import FeedStep, plain_transactions
from waltz_client.monitor import Outcome, OutcomeKind, TransactionMonitor
from waltz_client.partition_env import PartitionEnv, PendingAppend
from waltz_common.types import crc32

log = logging.getLogger("waltz_client.partition")  # the partition's log, as before the split

MAX_MERGED_FEED = 10_000  # feed entries applied in one callback-thread call when the partition is behind
RECHECK = object()  # inbox event: the topology changed


def merge_feeds(inbox: asyncio.Queue[Any], backlog: deque[Any], batched: bool, conn: object,
                entries: Sequence[server_pb2.FeedData]) -> Sequence[server_pb2.FeedData]:
    """The entries of this feed message and of those right behind it in the inbox (up to MAX_MERGED_FEED): a
    partition that fell behind applies its backlog in one callback-thread call (and one data read), not one
    message at a time, so that it catches up faster than the log grows. Other events keep their order (backlog).
    Only for callbacks that apply batches (apply_transactions): one by one, a merge would only hold back the
    high-water mark until its last transaction."""
    if inbox.empty() or not batched:
        return entries
    merged: list[server_pb2.FeedData] | None = None
    while len(entries) + (len(merged) if merged is not None else 0) < MAX_MERGED_FEED:
        try:
            event = inbox.get_nowait()
        except asyncio.QueueEmpty:
            break
        message = event[1] if event is not RECHECK and event[0] is conn else None
        if message is None or message.WhichOneof("message") != "feed":
            backlog.append(event)
            break
        if merged is None:
            merged = list(entries)
        merged.extend(message.feed.transactions)
    return entries if merged is None else merged


FeedPlan = tuple[list[FeedStep], list[tuple[PendingAppend, Outcome]], int | None, int, int]
"""A feed batch's steps, the older appends its commits prove lost (resolved after the apply), the id past a gap
(None: none), the entries of other partitions ignored, the batch's last transaction of another client (-1)."""


class FeedIntake:
    """Turns a partition's feed entries into the steps to apply, deciding its own appends' fate with the monitor;
    other clients' transactions get their data fetched by the apply on the callback thread, or, once the
    application showed it reads such data (reads_data), read ahead on the loop."""

    def __init__(self, partition_id: int, env: PartitionEnv, monitor: TransactionMonitor[PendingAppend]) -> None:
        self.partition_id = partition_id
        self.env = env
        self.monitor = monitor
        self.reads_data = False  # the application read another client's data: later batches' is read ahead

    def plain(self, entries: Sequence[server_pb2.FeedData], next_id: int,
              inline: bool = True) -> tuple[list[Transaction], BatchData | None]:
        """The batch's leading entries that need no step of their own (plain_transactions), and the data source of
        a batch of more than one entry (shared with the steps of the rest). inline: the feed was asked for inline
        data (plain_transactions)."""
        fetch: Callable[[int, int], bytes] = self.fetch_one
        source: BatchData | None = None
        if len(entries) > 1:
            source = BatchData(fetch, self.fetch_range if self.env.fetch_range is not None else None, -1)
            fetch = source
        own = self.env.client_id if self.monitor.pending_count() else None
        plain = plain_transactions(entries, next_id, self.partition_id, own, fetch, inline)
        if source is not None and plain:
            source.last_id = plain[-1].transaction_id
        return plain, source

    def steps(self, entries: Sequence[server_pb2.FeedData], next_id: int, plain: Sequence[Transaction] = (),
              source: BatchData | None = None) -> FeedPlan:
        """The steps of a feed batch whose first transaction to apply is next_id; plain: its leading entries'
        transactions (self.plain), made with source."""
        steps: list[FeedStep] = [(t.transaction_id, None, t) for t in plain]
        superseded: list[tuple[PendingAppend, Outcome]] = []
        gap_at: int | None = None
        foreign = 0
        pid, client_id = self.partition_id, self.env.client_id
        fetch: Callable[[int, int], bytes] = self.fetch_one if source is None else source
        # source: made at the batch's first transaction without data at hand, unless given
        last_foreign = plain[-1].transaction_id if plain else -1  # the batch's last such: the source reads up to it
        next_id += len(plain)
        commit_oldest, on_feed = self.monitor.commit_oldest, self.monitor.on_feed
        latency = self.env.latency
        now = time.monotonic() if latency is not None else 0.0
        sent_at, sent_together = 0.0, 0  # a run of own appends sent at once (one sent_at): one observation
        for entry in islice(entries, len(plain), None):
            req_id = entry.req_id  # the protobuf ReqId: none made for the lookup, nor for the Transaction
            if req_id.partition_id != pid:
                foreign += 1  # a server that breaks the one-partition-per-batch contract
                continue
            txn_id = entry.transaction_id
            if txn_id > next_id:
                gap_at = txn_id
                break
            mine = None
            if req_id.client_id == client_id:  # only this client's own appends (of this partition) are in the monitor
                mine = commit_oldest(req_id.seq_num)
                if mine is None:
                    for token, outcome in on_feed(req_id, txn_id):
                        if outcome.kind is OutcomeKind.COMMITTED:
                            mine = token
                        else:  # older appends this commit proves lost: resolved after the apply, so retries see it
                            superseded.append((token, outcome))
                if mine is not None and latency is not None:
                    if mine.sent_at == sent_at:
                        sent_together += 1
                    else:
                        if sent_together:
                            latency.observe_counted(now - sent_at, sent_together)
                        sent_at, sent_together = mine.sent_at, 1
            if txn_id == next_id:
                next_id += 1
                data = None if mine is None else mine.data
                if mine is None:
                    if entry.has_data:
                        data = self._inline(entry)
                    if data is None:
                        last_foreign = txn_id
                        if source is None and len(entries) > 1:
                            source = BatchData(fetch, self.fetch_range if self.env.fetch_range is not None else None,
                                               -1)
                            fetch = source
                steps.append((txn_id, mine, FedTransaction(pid, txn_id, req_id, entry.header, fetch, data)))
            elif mine is not None:
                steps.append((txn_id, mine, None))
        if sent_together:
            latency.observe_counted(now - sent_at, sent_together)  # type: ignore[union-attr]  # (counted: not None)
        if source is not None:
            source.last_id = last_foreign
        return steps, superseded, gap_at, foreign, last_foreign

    def _inline(self, entry: server_pb2.FeedData) -> bytes | None:
        """An entry's inline data, if its checksum holds (else None: it is fetched, as without inline data)."""
        data = entry.data
        if crc32(data) == entry.checksum:
            self.env.stats.inline_data += 1
            return data
        log.warning("partition %d: the inline data of transaction %d fails its checksum; fetching it",
                    self.partition_id, entry.transaction_id)
        return None

    def fetch_one(self, partition_id: int, transaction_id: int) -> bytes:
        self.reads_data = True  # on the callback thread: the application reads other clients' data
        self.env.stats.fetched += 1
        return self.env.fetch(partition_id, transaction_id)

    def fetch_range(self, partition_id: int, first: int, last: int) -> dict[int, bytes]:
        self.reads_data = True
        assert self.env.fetch_range is not None
        data = self.env.fetch_range(partition_id, first, last)
        self.env.stats.fetched += len(data)
        return data

    async def read_ahead(self, steps: list[FeedStep]) -> None:
        """For an application that reads other clients' data: read the batch's on the loop, before its apply, so
        that the callback thread never waits for the network (an execute() can run meanwhile). A read that fails
        leaves the rest to the apply's own fetches, which retry."""
        await self.read_ahead_of([t for _, mine, t in steps if mine is None and t is not None])

    async def read_ahead_of(self, transactions: Sequence[Transaction]) -> None:
        """read_ahead, of these transactions (those of other clients)."""
        read = self.env.read_range
        if read is None:
            return
        wanted = [t for t in transactions if isinstance(t, FedTransaction) and not t.loaded]
        if not wanted:
            return
        data: dict[int, bytes] = {}
        first, last = wanted[0].transaction_id, wanted[-1].transaction_id
        try:
            for start in range(first, last + 1, READ_CHUNK):
                data.update(await read(self.partition_id, start, min(last, start + READ_CHUNK - 1)))
        except Exception as exc:
            log.debug("partition %d: reading transactions %d..%d ahead failed: %s", self.partition_id, first, last, exc)
        self.env.stats.fetched += len(data)
        for transaction in wanted:
            transaction.preload(data.get(transaction.transaction_id))
