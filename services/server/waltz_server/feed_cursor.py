"""Feed scheduling for one (client stream, partition): what to send next, from where, and when READY."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class Source(Enum):
    WAIT = "wait"  # nothing to send until the high-water mark moves
    CACHE = "cache"  # send [first, first + count) from the feed cache
    STORE = "store"  # read [first, first + count) headers from the store, then send them
    READY = "ready"  # the mount's catch-up is complete: send MountResponse READY


@dataclass(frozen=True, slots=True)
class FeedStep:
    source: Source
    first: int = 0
    count: int = 0


class FeedCursor:
    """The next transaction a feed owes its client, and the mount target it must reach first.

    A mount feeds every transaction up to `ready_at` (the high-water mark once the client's own
    appends were flushed), then READY, then goes on feeding new commits; a feed request only
    moves the cursor. Far-behind reads (below the cache) go to the store in `fetch_size` steps.
    """

    def __init__(self, next_id: int, ready_at: int | None = None) -> None:
        self.next_id = next_id
        self.ready_at = ready_at

    def restart(self, client_high_water_mark: int) -> None:
        """A feed request: continue from just above the client's high-water mark."""
        self.next_id = client_high_water_mark + 1

    def step(self, high_water_mark: int, cache_first_id: int, batch_size: int, fetch_size: int) -> FeedStep:
        if self.ready_at is not None and self.next_id > self.ready_at:
            return FeedStep(Source.READY)
        last = high_water_mark if self.ready_at is None else min(high_water_mark, self.ready_at)
        if self.next_id > last:
            return FeedStep(Source.WAIT)
        if self.next_id >= cache_first_id:
            return FeedStep(Source.CACHE, self.next_id, min(batch_size, last - self.next_id + 1))
        count = min(fetch_size, cache_first_id - self.next_id, last - self.next_id + 1)
        return FeedStep(Source.STORE, self.next_id, count)

    def sent(self, count: int) -> None:
        self.next_id += count

    def ready_sent(self) -> None:
        self.ready_at = None

    def lag(self, high_water_mark: int) -> int:
        return max(0, high_water_mark - self.next_id + 1)
