"""Bounded in-memory caches of one partition: recent feed entries (by batch) and transaction data (LRU).

Each is bounded on its own (entries, data bytes) and charges a CacheBudget, shared by every partition of the
server, what it holds; the budget makes the largest caches give back their oldest entries when together they
hold more than it allows.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import OrderedDict
from collections.abc import Sequence
from typing import Generic, Protocol, TypeVar

from waltz_server.cache_budget import DATA_ENTRY_BYTES, FEED_ENTRY_BYTES, CacheBudget

UNBOUNDED = 2**62
"""The budget of a cache given none: only its own bound holds."""

T = TypeVar("T")


class FeedCache(Generic[T]):
    """The feed entries of the most recent `capacity` committed transactions, by transaction id.

    Kept as the sequences appended (one per committed batch, never copied entry by entry: the
    append path adds a batch's feed message as it is), found by bisecting their first ids, so
    reading a window near the tail costs only the window, whatever the capacity.
    """

    kind = "feed"

    def __init__(self, capacity: int, high_water_mark: int = -1, budget: CacheBudget | None = None,
                 entry_bytes: int = FEED_ENTRY_BYTES) -> None:
        if capacity < 1:
            raise ValueError("feed cache capacity must be at least 1")
        self._capacity = capacity
        self._entry_bytes = entry_bytes  # what the budget is charged per entry
        self.charged = 0
        self._budget = budget if budget is not None else CacheBudget(UNBOUNDED)
        self._firsts: list[int] = []  # first id of each segment, ascending
        self._segments: list[Sequence[T]] = []
        self._wholes: list[object] = []  # what each segment came in, if the caller said (spans returns it)
        self._head = 0  # segments before it are wholly below first_id (dropped in bulk now and then)
        self._last = high_water_mark
        self._count = 0
        self._budget.join(self)

    @property
    def high_water_mark(self) -> int:
        return self._last

    @property
    def first_id(self) -> int:
        """The lowest id held (high_water_mark + 1 when empty)."""
        return self._last - self._count + 1

    def append(self, first_id: int, entries: Sequence[T], whole: object = None) -> None:
        """Add the entries of consecutive ids from first_id; a gap (or overlap) restarts the cache. whole: what
        they came in (a committed batch's feed message), kept with them for spans.

        The cache keeps entries as it is given them: the caller must not change them afterwards.
        """
        if first_id != self._last + 1:
            self.restart(first_id - 1)
        n = len(entries)
        if n == 0:
            return
        self._firsts.append(first_id)
        self._segments.append(entries)
        self._wholes.append(whole)
        self._last += n
        self._count = min(self._capacity, self._count + n)
        self._drop_below()
        self._account()

    def restart(self, high_water_mark: int) -> None:
        """Hold nothing, the next entry being high_water_mark + 1."""
        self._firsts.clear()
        self._segments.clear()
        self._wholes.clear()
        self._head = 0
        self._count = 0
        self._last = high_water_mark
        self._account()

    def evict(self, nbytes: int) -> None:
        """Drop the oldest entries worth at least nbytes (the budget's reclaim)."""
        self._count -= min(self._count, -(-nbytes // self._entry_bytes))
        if self._count:
            self._drop_below()
        else:
            self._firsts.clear()
            self._segments.clear()
            self._wholes.clear()
            self._head = 0
        self._account()

    def close(self) -> None:
        """Drop everything and leave the budget (anything added later is charged to a budget of its own)."""
        self.restart(self._last)
        self._budget = _left(self._budget, self)

    def _drop_below(self) -> None:
        first = self.first_id
        firsts, segments, head = self._firsts, self._segments, self._head
        while firsts[head] + len(segments[head]) <= first:
            head += 1
        if head >= 32:  # dropped segments go soon: their memory is what the budget was told is free
            del firsts[:head], segments[:head], self._wholes[:head]
            head = 0
        self._head = head

    def _account(self) -> None:
        charged = self._count * self._entry_bytes
        delta, self.charged = charged - self.charged, charged
        if delta > 0:
            self._budget.charge(delta)
        else:
            self._budget.release(-delta)

    def spans(self, from_id: int, max_count: int) -> list[tuple[int, int, int, object]] | None:
        """Where get(from_id, max_count) takes its entries, segment by segment: (the segment's first id, the offset
        in it of the first entry taken, how many, what the segment came in: append's whole); None when from_id is
        not held."""
        if from_id < self.first_id or from_id > self._last + 1:
            return None
        count = min(max_count, self._last - from_id + 1)
        i = bisect_right(self._firsts, from_id, self._head) - 1
        out: list[tuple[int, int, int, object]] = []
        while count > 0:
            first = self._firsts[i]
            offset = from_id - first
            taken = min(count, len(self._segments[i]) - offset)
            out.append((first, offset, taken, self._wholes[i]))
            from_id += taken
            count -= taken
            i += 1
        return out

    def get(self, from_id: int, max_count: int) -> list[T] | None:
        """Entries from from_id on (at most max_count, fewer at the tail); None when from_id is not held."""
        if from_id < self.first_id or from_id > self._last + 1:
            return None
        count = min(max_count, self._last - from_id + 1)
        if count <= 0:
            return []
        i = bisect_right(self._firsts, from_id, self._head) - 1
        out: list[T] = []
        while len(out) < count:
            offset = from_id + len(out) - self._firsts[i]
            out.extend(self._segments[i][offset : offset + count - len(out)])
            i += 1
        return out


class TransactionData(Protocol):
    """What a Transaction Data answer needs: a Record, or the AppendRequest that became the transaction."""

    @property
    def data(self) -> bytes: ...

    @property
    def checksum(self) -> int: ...


class DataCache:
    """Recent transactions' data by id, least recently used evicted first, bounded by data bytes (its own
    bound) and by the budget it charges (data bytes plus DATA_ENTRY_BYTES per entry)."""

    kind = "data"

    def __init__(self, max_bytes: int, budget: CacheBudget | None = None) -> None:
        self._max_bytes = max_bytes
        self._max_entry = max_bytes // 4
        self._records: OrderedDict[int, tuple[TransactionData, int]] = OrderedDict()
        self._bytes = 0
        self.charged = 0
        self._budget = budget if budget is not None else CacheBudget(UNBOUNDED)
        self._budget.join(self)

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
            self.charged -= evicted + DATA_ENTRY_BYTES
            self._budget.release(evicted + DATA_ENTRY_BYTES)
        self.charged += size + DATA_ENTRY_BYTES
        self._budget.charge(size + DATA_ENTRY_BYTES)

    def put_many(self, first_id: int, entries: Sequence[tuple[TransactionData, int]]) -> None:
        """put() of each (entry, size) as transactions first_id.. (a committed batch): the bounds are kept, and
        the budget charged, once for the batch."""
        records, max_entry = self._records, self._max_entry
        added = count = 0
        for transaction_id, (entry, size) in enumerate(entries, first_id):
            if size > max_entry or transaction_id in records:
                continue
            records[transaction_id] = (entry, size)
            added += size
            count += 1
        if not count:
            return
        self._bytes += added
        evicted = evicted_count = 0
        while self._bytes > self._max_bytes:
            _, (_, size) = records.popitem(last=False)
            self._bytes -= size
            evicted += size
            evicted_count += 1
        freed = evicted + evicted_count * DATA_ENTRY_BYTES
        self.charged -= freed
        self._budget.release(freed)
        taken = added + count * DATA_ENTRY_BYTES
        self.charged += taken
        self._budget.charge(taken)

    def evict(self, nbytes: int) -> None:
        """Drop the least recently used entries worth at least nbytes (the budget's reclaim)."""
        freed = 0
        records = self._records
        while freed < nbytes and records:
            _, (_, size) = records.popitem(last=False)
            self._bytes -= size
            freed += size + DATA_ENTRY_BYTES
        self.charged -= freed
        self._budget.release(freed)

    def get(self, transaction_id: int) -> TransactionData | None:
        found = self._records.get(transaction_id)
        if found is None:
            return None
        self._records.move_to_end(transaction_id)
        return found[0]

    def clear(self) -> None:
        self._records.clear()
        self._bytes = 0
        self._budget.release(self.charged)
        self.charged = 0

    def close(self) -> None:
        """Drop everything and leave the budget (a read finishing later caches into a budget of its own)."""
        self.clear()
        self._budget = _left(self._budget, self)


def _left(budget: CacheBudget, cache: FeedCache[T] | DataCache) -> CacheBudget:
    """cache leaves budget; the unbounded budget it joins instead."""
    budget.leave(cache)
    own = CacheBudget(UNBOUNDED)
    own.join(cache)
    return own
