"""Append transactions to a real cluster through the client library and collect the feed they produce."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable

from waltz_client.api import Transaction, TransactionBuilder, TransactionContext, WaltzClientCallbacks
from waltz_client.blocking import WaltzClient

FeedEntry = tuple[int, int, int, int]
"""(client_id, generation, seq_num, header) of one committed transaction."""


class FeedCollector(WaltzClientCallbacks):
    """Remembers the ReqId and header of every transaction the feed delivers."""

    def __init__(self) -> None:
        self.feed: dict[tuple[int, int], FeedEntry] = {}
        self._lock = threading.Lock()

    def get_client_high_water_mark(self, partition_id: int) -> int:
        with self._lock:
            return max((t for p, t in self.feed if p == partition_id), default=-1)

    def apply_transaction(self, transaction: Transaction) -> None:
        r = transaction.req_id
        with self._lock:
            self.feed[(transaction.partition_id, transaction.transaction_id)] = (
                r.client_id,
                r.generation,
                r.seq_num,
                transaction.header,
            )


class Put(TransactionContext):
    """Append data with header to one partition, no locks."""

    def __init__(self, partition: int, header: int, data: bytes) -> None:
        self.partition, self.header, self.data = partition, header, data

    def partition_id(self, num_partitions: int) -> int:
        return self.partition

    def execute(self, builder: TransactionBuilder) -> bool:
        builder.set_header(self.header)
        builder.set_data(self.data)
        return True


def append(
    config: dict, items: Iterable[tuple[int, int, bytes]], timeout_s: float = 120.0
) -> dict[tuple[int, int], FeedEntry]:
    """Commit every (partition, header, data); returns the whole feed (all partitions) once it holds them."""
    collector = FeedCollector()
    items = list(items)
    with WaltzClient(collector, {"client.maxConcurrentTransactions": 500, **config}) as client:
        futures = [client.submit(Put(p, h, d)) for p, h, d in items]
        assert all(f.result(timeout_s) for f in futures), "a transaction was not committed"
        client.flush(timeout_s)
        deadline = time.monotonic() + timeout_s
        expected = {p: client.high_water_mark(p) for p in client.partitions}
        while any(collector.get_client_high_water_mark(p) < hwm for p, hwm in expected.items()):
            assert time.monotonic() < deadline, "the feed did not catch up with the high-water marks"
            time.sleep(0.05)
    return dict(collector.feed)
