"""This client's pending appends' write locks on one partition, and the appends parked behind them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Generic, TypeVar

T = TypeVar("T")


class OwnLocks(Generic[T]):
    """An append whose write or read lock is a write lock of one of the client's own pending appends cannot commit
    if that one commits (its id is above every id the new one's execute() saw), and waits at the server for its
    outcome. So it is not sent: it is parked, and executed again once that append is resolved (its commit applied,
    or its failure final), against state at least that fresh. No I/O; tokens are compared by identity.

    Issue 31: 20 submitters of an instance on 4 hot items sent about five appends per item at once; the server
    failed all but one of them at each commit, and each failure was a round trip and a re-execution.

    Shell usage: admit(token, write, read) before sending an append with locks (False: parked, do not send, keep
    its slot); release(token, write) when a sent append is resolved (committed, failed or given up): execute the
    tokens it returns again."""

    def __init__(self) -> None:
        self._holders: dict[int, T] = {}  # lock hash -> the pending append writing it
        self._parked: dict[int, list[T]] = {}  # lock hash -> appends parked until its holder is resolved
        self._parked_count = 0

    @property
    def parked(self) -> int:
        return self._parked_count

    def admit(self, token: T, write: Sequence[int], read: Sequence[int]) -> bool:
        """True: token may be sent, and now holds its write locks. False: one of its locks is held by another
        pending append; token is parked behind it (nothing else changes)."""
        holders = self._holders
        if holders:
            for lock in (*write, *read):
                holder = holders.get(lock)
                if holder is not None and holder is not token:
                    self._parked.setdefault(lock, []).append(token)
                    self._parked_count += 1
                    return False
        for lock in write:
            holders[lock] = token
        return True

    def release(self, token: T, write: Sequence[int]) -> list[T]:
        """token was resolved: its write locks are free; the appends parked behind them, in the order they were
        parked, to execute again."""
        released: list[T] = []
        holders = self._holders
        for lock in write:
            if holders.get(lock) is token:
                del holders[lock]
                released += self._parked.pop(lock, ())
        self._parked_count -= len(released)
        return released

    def release_all(self) -> list[T]:
        """Every parked append (the client is closing, or its partition failed): they execute again and meet it."""
        released = [token for tokens in self._parked.values() for token in tokens]
        self._holders.clear()
        self._parked.clear()
        self._parked_count = 0
        return released
