"""The pending-append slots of one partition and the submits waiting for one: first come, first served.

A pure core (no asyncio): ClientPartition's shell asks it and carries out what it answers. Overload is a queue,
not a herd: a submit that finds no free slot joins the queue and is handed a slot alone when it reaches the head
(grant() pops exactly as many waiters as there are free slots), so the work per freed slot is constant however many
wait. A slot is free when the appends pending in the monitor plus the slots reserved here (taken by a submit that
has not become a pending append yet, or held for a retry) are fewer than the capacity.

Every waiter waits the same time-out from its arrival, so the deadlines are in queue order and expire() only ever
looks at the head: the oldest times out first, and one timer (the head's) serves the whole queue.
"""

from __future__ import annotations

from collections import deque
from typing import Generic, TypeVar

W = TypeVar("W")


class SlotQueue(Generic[W]):
    """Capacity, reserved slots and the waiters in arrival order (W: whatever the shell wakes, e.g. a future)."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self.capacity = capacity
        self.reserved = 0
        self._queue: deque[tuple[float, W]] = deque()  # (arrived at, waiter); a waiter that left is skipped
        self._waiting: set[W] = set()  # those in _queue that have not left

    def __len__(self) -> int:
        return len(self._waiting)

    def free(self, pending: int) -> bool:
        return pending + self.reserved < self.capacity

    def take(self, pending: int) -> bool:
        """Reserve a slot at once if one is free and nobody waits for one (who would be ahead)."""
        if not self._waiting and pending + self.reserved < self.capacity:
            self.reserved += 1
            return True
        return False

    def hold(self, count: int = 1) -> None:
        """Reserve whatever the capacity: a retry takes the place its failed append just left (its priority)."""
        self.reserved += count

    def put_back(self, count: int = 1) -> None:
        """Reserved slots given up, or turned into pending appends (the shell then calls grant())."""
        self.reserved -= count

    def wait(self, waiter: W, now: float) -> None:
        """Join the queue (after take() answered False)."""
        self._queue.append((now, waiter))
        self._waiting.add(waiter)

    def grant(self, pending: int) -> list[W]:
        """The waiters handed a free slot each (reserved for them), oldest first; usually none or one."""
        granted: list[W] = []
        queue, waiting = self._queue, self._waiting
        while waiting and pending + self.reserved < self.capacity:
            _, waiter = queue.popleft()
            if waiter in waiting:
                waiting.discard(waiter)
                self.reserved += 1
                granted.append(waiter)
        self._trim()
        return granted

    def leave(self, waiter: W) -> bool:
        """A waiter gave up (cancelled): True if it was still waiting (else it was granted a slot, or expired)."""
        if waiter in self._waiting:
            self._waiting.discard(waiter)
            self._trim()
            return True
        return False

    def expire(self, now: float, timeout: float) -> list[W]:
        """The waiters that arrived `timeout` or more before now, oldest first: they leave the queue."""
        expired: list[W] = []
        queue, waiting = self._queue, self._waiting
        while queue and queue[0][0] + timeout <= now:
            _, waiter = queue.popleft()
            if waiter in waiting:
                waiting.discard(waiter)
                expired.append(waiter)
        self._trim()
        return expired

    def deadline(self, timeout: float) -> float | None:
        """When the oldest waiter times out (None: nobody waits)."""
        return self._queue[0][0] + timeout if self._queue else None

    def drain(self) -> list[W]:
        """Every waiter, oldest first, and the queue emptied (the partition failed or the client closed)."""
        drained = [waiter for _, waiter in self._queue if waiter in self._waiting]
        self._queue.clear()
        self._waiting.clear()
        return drained

    def _trim(self) -> None:
        """Drop the waiters that left from the head, so the head is always one still waiting (deadline())."""
        queue, waiting = self._queue, self._waiting
        while queue and queue[0][1] not in waiting:
            queue.popleft()
