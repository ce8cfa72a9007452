"""The server-wide memory budget shared by the feed and transaction-data caches of every partition it owns.

Each cache charges the budget what it holds (an estimate in bytes) and releases it as it evicts. When the
caches together go over the budget, the largest of them gives back memory first (oldest entries), until
the total is a little under the budget, so a server's cache memory stays within one bound however many
partitions it owns, and the busiest partitions do not starve the others' tails.
"""

from __future__ import annotations

from typing import Protocol

FEED_ENTRY_BYTES = 120
"""What one cached feed entry (a FeedData in its batch's feed message, its share of the message's arena)
costs in RSS: 108 B measured with batches of 100 on CPython 3.11 and upb (protobuf 5)."""
DATA_ENTRY_BYTES = 1000
"""What one cached transaction costs beyond its data bytes: its share of the parsed AppendBatch's arena
(about 230 B), the AppendRequest's Python object and the LRU map's entry and tuple (about 360 B), measured
as FEED_ENTRY_BYTES; a server's RSS grew by about 1,500 B per cached 512 B transaction (bench.curves.memory),
the allocator's slack included, hence 1,000."""


class BudgetedCache(Protocol):
    """A cache whose memory the budget bounds."""

    kind: str
    """'feed' or 'data' (for the metrics)."""
    charged: int
    """Bytes charged to the budget for what the cache holds now."""

    def evict(self, nbytes: int) -> None:
        """Drop the oldest entries worth at least nbytes (or all), releasing them from the budget."""


class CacheBudget:
    """A byte budget over a set of caches; `used` is what they hold together."""

    def __init__(self, max_bytes: int, slack: float = 1 / 64) -> None:
        if max_bytes < 1:
            raise ValueError("the cache budget must be at least 1 byte")
        self.max_bytes = max_bytes
        self.used = 0
        self._floor = max_bytes - int(max_bytes * slack)  # a reclaim goes down to here: not one per put
        self._caches: list[BudgetedCache] = []

    def join(self, cache: BudgetedCache) -> None:
        self._caches.append(cache)
        self.charge(cache.charged)

    def leave(self, cache: BudgetedCache) -> None:
        """The cache is dropped (its partition closed): what it held is free again."""
        if cache in self._caches:
            self._caches.remove(cache)
            self.used -= cache.charged

    def charge(self, nbytes: int) -> None:
        """A member cache took nbytes more (its `charged` already counts them)."""
        self.used += nbytes
        if self.used > self.max_bytes:
            self.reclaim()

    def release(self, nbytes: int) -> None:
        self.used -= nbytes

    def reclaim(self) -> None:
        """Evict from the largest caches until the total is at the floor."""
        while self.used > self._floor:
            victim = max(self._caches, key=_charged, default=None)
            if victim is None or victim.charged <= 0:
                return
            victim.evict(min(victim.charged, self.used - self._floor))

    def use_by_kind(self) -> dict[str, int]:
        """Bytes held by kind of cache ('feed', 'data'), for the metrics."""
        used = {"feed": 0, "data": 0}
        for cache in self._caches:
            used[cache.kind] = used.get(cache.kind, 0) + cache.charged
        return used

    def __len__(self) -> int:
        return len(self._caches)


def _charged(cache: BudgetedCache) -> int:
    return cache.charged
