"""A partition's optimistic lock table: hashed high-water marks of write, read and append locks."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Final

DEFAULT_SIZE: Final = 30000  # server.lockTableSize of the original
NUM_HASH_FUNCTIONS: Final = 3

_MULTIPLIER: Final = 1103515245
_ADDER: Final = 12345
_MASK: Final = 0x3FFFFFFF
SLOT_CACHE_LOCKS: Final = 65536
"""Locks whose slots a table remembers (an append's locks are looked up several times between its check and its
commit; a lock's slots cost three rounds of the LCG in Python each time): past it the memory starts again."""


@dataclass(frozen=True, slots=True)
class LockRequest:
    """The lock hashes (signed 32-bit ints) an append request carries, per kind."""

    write: tuple[int, ...] = ()
    read: tuple[int, ...] = ()
    append: tuple[int, ...] = ()
    any: bool = field(init=False, compare=False)  # some lock at all (most appends take none)
    recorded: tuple[int, ...] = field(init=False, compare=False, repr=False)
    """The write and append locks: what a commit records and an in-flight request holds."""
    checked: tuple[int, ...] = field(init=False, compare=False, repr=False)
    """The write and read locks: what the check reads."""
    _hash: int = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "any", bool(self.write or self.read or self.append))
        object.__setattr__(self, "recorded", self.write + self.append)
        object.__setattr__(self, "checked", self.write + self.read)
        object.__setattr__(self, "_hash", hash((self.write, self.read, self.append)))

    def __hash__(self) -> int:  # once (the table's in-flight count looks a request up twice or more)
        return self._hash


_RequestSlots = tuple[list[int], list[int], list[tuple[int, ...]]]


class LockTable:
    """For each lock, an upper bound of the id of the last committed transaction that wrote or appended it.

    A lock hash maps to NUM_HASH_FUNCTIONS slots (the original's LCG); a lock's high-water mark is the
    minimum over its slots, so collisions can only raise it: false conflicts are possible, missed ones are
    not. WRITE locks are checked and recorded, READ locks checked only, APPEND locks recorded only.

    The shell runs each append request, in its partition's append order, through:
      1. begin(request). False: it touches a lock of an in-flight (appended, not yet committed) transaction,
         and its check would not yet see that transaction. Hold it back (the original holds the whole append
         queue) and retry after an end(); if nothing is in flight any more, reset the table.
      2. check(request, client_high_water_mark). An id: answer LockFailure with it, then end(request).
      3. Append it. On commit: commit(request, transaction_id), then end(request). On failure: end(request).
    """

    def __init__(self, high_water_mark: int, size: int = DEFAULT_SIZE, num_hash_functions: int = NUM_HASH_FUNCTIONS):
        if size <= 0 or num_hash_functions <= 0:
            raise ValueError("the lock table needs a positive size and number of hash functions")
        self.size = size
        self.num_hash_functions = num_hash_functions
        self._high_water_marks = [high_water_mark] * size
        self._in_flight_marks = [0] * size  # per slot, in-flight write/append locks on it
        self._in_flight: Counter[LockRequest] = Counter()
        self._slot_cache: dict[int, tuple[int, ...]] = {}
        self._request_cache: dict[LockRequest, _RequestSlots] = {}
        self.version = 0
        """Grows whenever a lock's mark may have moved (commit, reset): a check's answer holds until it does."""

    @property
    def num_in_flight(self) -> int:
        """Requests begun and not yet ended."""
        return self._in_flight.total()

    def slots(self, lock_hash: int) -> tuple[int, ...]:
        """The table slots of a lock: h = h * 1103515245 + 12345 (32-bit wrap), slot = (h & 0x3FFFFFFF) % size."""
        cache = self._slot_cache
        cached = cache.get(lock_hash)
        if cached is not None:
            return cached
        h = lock_hash & 0xFFFFFFFF
        slots = []
        for _ in range(self.num_hash_functions):
            h = (h * _MULTIPLIER + _ADDER) & 0xFFFFFFFF
            slots.append((h & _MASK) % self.size)
        if len(cache) >= SLOT_CACHE_LOCKS:
            cache.clear()
        cached = cache[lock_hash] = tuple(slots)
        return cached

    def begin(self, request: LockRequest) -> bool:
        """Mark request in flight, unless one of its locks shares a slot with an in-flight write or append
        lock: then change nothing and answer False."""
        marks = self._in_flight_marks
        recorded, read, _ = self._request_slots(request)
        if any(map(marks.__getitem__, recorded)) or any(map(marks.__getitem__, read)):
            return False
        for s in recorded:
            marks[s] += 1
        self._in_flight[request] += 1
        return True

    def end(self, request: LockRequest) -> None:
        """The request begun with begin() was committed, failed or rejected: it is no longer in flight.
        A request that is not in flight (begun before a reset) is ignored."""
        if not self._in_flight[request]:
            return
        self._in_flight[request] -= 1
        marks = self._in_flight_marks
        for s in self._request_slots(request)[0]:
            marks[s] -= 1

    def lock_high_water_mark(self, request: LockRequest) -> int:
        """Max over the write and read locks of the min over each lock's slots; -1 without such locks."""
        get = self._high_water_marks.__getitem__
        return max([min(map(get, slots)) for slots in self._request_slots(request)[2]], default=-1)

    def check(self, request: LockRequest, client_high_water_mark: int) -> int | None:
        """None if the client saw every transaction that holds the request's write and read locks; otherwise
        the id of the (possibly falsely) conflicting transaction, for LockFailure."""
        mark = self.lock_high_water_mark(request)
        return mark if mark > client_high_water_mark else None

    def commit(self, request: LockRequest, transaction_id: int) -> None:
        """Record the committed transaction on the slots of its write and append locks."""
        marks = self._high_water_marks
        for s in self._request_slots(request)[0]:
            if marks[s] < transaction_id:
                marks[s] = transaction_id
        self.version += 1

    def reset(self, high_water_mark: int) -> None:
        """Forget everything: every lock's mark becomes high_water_mark (so a request with locks and an older
        client high-water mark fails once) and nothing is in flight. Meant for when nothing is in flight:
        a request still in flight afterwards is no longer guarded."""
        self._high_water_marks = [high_water_mark] * self.size
        self.version += 1
        self._in_flight_marks = [0] * self.size
        self._in_flight.clear()

    def _request_slots(self, request: LockRequest) -> _RequestSlots:
        """The slots of the request's recorded locks, of its read locks, and of each checked lock (a request is
        looked up from its check to its end: four times or more)."""
        cache = self._request_cache
        cached = cache.get(request)
        if cached is None:
            slots = self.slots
            recorded = [s for h in request.recorded for s in slots(h)]
            cached = (recorded, [s for h in request.read for s in slots(h)], [slots(h) for h in request.checked])
            if len(cache) >= SLOT_CACHE_LOCKS:
                cache.clear()
            cache[request] = cached
        return cached
