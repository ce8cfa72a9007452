"""Bounded in-memory caches of one partition: recent feed entries (ring) and transaction data (LRU)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Generic, Protocol, TypeVar

T = TypeVar("T")


class FeedCache(Generic[T]):
    """The feed entries of the most recent `capacity` committed transactions, by transaction id.

    A ring buffer indexed by id modulo capacity, so reading a window near the tail costs only
    the window, whatever the capacity.
    """

    def __init__(self, capacity: int, high_water_mark: int = -1) -> None:
        if capacity < 1:
            raise ValueError("feed cache capacity must be at least 1")
        self._capacity = capacity
        self._ring: list[T | None] = [None] * capacity
        self._last = high_water_mark
        self._count = 0

    @property
    def high_water_mark(self) -> int:
        return self._last

    @property
    def first_id(self) -> int:
        """The lowest id held (high_water_mark + 1 when empty)."""
        return self._last - self._count + 1

    def append(self, first_id: int, entries: Sequence[T]) -> None:
        """Add the entries of consecutive ids from first_id; a gap (or overlap) restarts the cache."""
        cap = self._capacity
        if first_id != self._last + 1:
            self._count = 0
            self._last = first_id - 1
        if len(entries) > cap:
            skipped = len(entries) - cap
            entries = entries[skipped:]
            self._last += skipped
            self._count = 0
        n = len(entries)
        start = (self._last + 1) % cap
        end = start + n
        if end <= cap:
            self._ring[start:end] = entries
        else:
            self._ring[start:] = entries[: cap - start]
            self._ring[: end - cap] = entries[cap - start :]
        self._last += n
        self._count = min(cap, self._count + n)

    def get(self, from_id: int, max_count: int) -> list[T] | None:
        """Entries from from_id on (at most max_count, fewer at the tail); None when from_id is not held."""
        if from_id < self.first_id or from_id > self._last + 1:
            return None
        count = min(max_count, self._last - from_id + 1)
        if count <= 0:
            return []
        start = from_id % self._capacity
        end = start + count
        if end <= self._capacity:
            part = self._ring[start:end]
        else:
            part = self._ring[start:] + self._ring[: end - self._capacity]
        return part  # type: ignore[return-value]


class TransactionData(Protocol):
    """What a Transaction Data answer needs: a Record, or the AppendRequest that became the transaction."""

    @property
    def data(self) -> bytes: ...

    @property
    def checksum(self) -> int: ...


class DataCache:
    """Recent transactions' data by id, least recently used evicted first, bounded by data bytes."""

    def __init__(self, max_bytes: int) -> None:
        self._max_bytes = max_bytes
        self._max_entry = max_bytes // 4
        self._records: OrderedDict[int, tuple[TransactionData, int]] = OrderedDict()
        self._bytes = 0

    @property
    def size_bytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._records)

    def put(self, transaction_id: int, entry: TransactionData, size: int) -> None:
        """Cache entry (whose data is size bytes) as transaction_id's."""
        if size > self._max_entry or transaction_id in self._records:
            return
        self._records[transaction_id] = (entry, size)
        self._bytes += size
        while self._bytes > self._max_bytes:
            _, (_, evicted) = self._records.popitem(last=False)
            self._bytes -= evicted

    def get(self, transaction_id: int) -> TransactionData | None:
        found = self._records.get(transaction_id)
        if found is None:
            return None
        self._records.move_to_end(transaction_id)
        return found[0]

    def clear(self) -> None:
        self._records.clear()
        self._bytes = 0
