"""This client's pending appends' write locks on one partition, and the appends parked behind them."""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Generic, TypeVar

T = TypeVar("T")


class OwnLocks(Generic[T]):
    """An append whose write or read lock is a write lock of one of the client's own pending appends cannot commit
    if that one commits (its id is above every id the new one's execute() saw), and waits at the server for its
    outcome. So it is not sent: it is parked, and executed again once that append is resolved (its commit applied,
    or its failure final), against state at least that fresh. No I/O; tokens are compared by identity.

    A freed lock is handed to the FIRST append parked behind it (FIFO), which holds it from then on while it
    executes again; the others stay parked. (Handing it to every parked append made all of them execute again at
    once, each reading the application's database, and all but one park again: on PostgreSQL a storm of
    re-executions.) A token holds locks from admit() (or from being handed one) until release(); a parked token
    holds none (admit() hands on what it held before parking it), so a lock with appends parked behind it always
    has a holder that is executing or sent, and no two tokens wait for each other.

    Issue 31: 20 submitters of an instance on 4 hot items sent about five appends per item at once; the server
    failed all but one of them at each commit, and each failure was a round trip and a re-execution.

    Shell usage: admit(token, write, read) after each execute() that built an append with locks, or whenever the
    token holds locks (holds(token)); False: parked, do not send, keep its slot. release(token) in EVERY end of an
    append that holds locks (committed, failed, declined, given up, cancelled) and before a retry executes again.
    Both return the tokens handed a lock: execute each of them again. release_all() when the partition fails or
    the client closes: every parked token, to execute again and meet the error."""

    __slots__ = ("_held", "_holders", "_parked", "_parked_on")

    def __init__(self) -> None:
        self._holders: dict[int, T] = {}  # lock hash -> the token holding it (executing again, or sent)
        self._held: dict[T, tuple[int, ...]] = {}  # token -> the locks it holds
        self._parked: dict[int, deque[T]] = {}  # lock hash -> tokens parked until it is handed on, first first
        self._parked_on: dict[T, int] = {}  # parked token -> the lock it waits for

    @property
    def parked(self) -> int:
        return len(self._parked_on)

    def idle(self) -> bool:
        """Whether no token holds or waits for a lock: then admit() of a token without locks and release() of any
        token change nothing, and a batch of appends without locks can skip them (one test per batch)."""
        return not (self._held or self._parked_on)

    def holds(self, token: T) -> bool:
        """Whether token holds any lock (admitted, or handed one)."""
        return token in self._held

    def holder(self, lock: int) -> T | None:
        return self._holders.get(lock)

    def parked_on(self, token: T) -> int | None:
        """The lock token is parked behind, or None."""
        return self._parked_on.get(token)

    def admit(self, token: T, write: Sequence[int], read: Sequence[int]) -> tuple[bool, list[T]]:
        """(True, handed): token may be sent, and holds exactly its write locks from now on; any other lock it held
        (handed to it, or its previous attempt's) went to the next token parked behind it, in handed.
        (False, handed): another token holds one of its locks; token is parked behind that lock, and every lock it
        held went on as above. token must not be parked."""
        if token in self._parked_on:
            raise ValueError("admit() of a parked token: it is executed again only once handed a lock")
        holders = self._holders
        if holders:
            for lock in (*write, *read):
                holder = holders.get(lock)
                if holder is not None and holder is not token:
                    released = self.release(token)
                    self._parked.setdefault(lock, deque()).append(token)
                    self._parked_on[token] = lock
                    return False, released
        handed: list[T] = []
        kept = tuple(dict.fromkeys(write))
        for lock in self._held.get(token, ()):
            if lock not in kept:
                self._hand_on(lock, handed)
        for lock in kept:
            holders[lock] = token
        if kept:
            self._held[token] = kept
        else:
            self._held.pop(token, None)
        return True, handed

    def release(self, token: T) -> list[T]:
        """token's append ended, or executes again: each lock it holds goes to the first token parked behind it
        (returned, in lock order: execute each again); a parked token leaves its queue. Unknown tokens: []."""
        handed: list[T] = []
        for lock in self._held.pop(token, ()):
            self._hand_on(lock, handed)
        parked_on = self._parked_on.pop(token, None)
        if parked_on is not None:
            queue = self._parked[parked_on]
            queue.remove(token)
            if not queue:
                del self._parked[parked_on]
        return handed

    def _hand_on(self, lock: int, handed: list[T]) -> None:
        queue = self._parked.get(lock)
        if not queue:
            del self._holders[lock]
            return
        token = queue.popleft()
        if not queue:
            del self._parked[lock]
        del self._parked_on[token]
        self._holders[lock] = token
        self._held[token] = (lock,)  # a parked token held nothing
        handed.append(token)

    def release_all(self) -> list[T]:
        """Every parked token, first parked first per lock (the client is closing, or its partition failed): they
        execute again and meet it. Holders are forgotten; their release() later is a no-op."""
        released = [token for tokens in self._parked.values() for token in tokens]
        self._holders.clear()
        self._held.clear()
        self._parked.clear()
        self._parked_on.clear()
        return released

    def check(self) -> None:
        """The invariants (tests): every lock with tokens parked behind it has a holder, which is not parked; a
        parked token holds nothing and waits in exactly one queue; _holders and _held agree."""
        assert all(lock in self._holders for lock in self._parked), "a lock with parked tokens has no holder"
        assert all(self._holders[lock] not in self._parked_on for lock in self._parked), "a parked holder"
        assert not set(self._parked_on) & set(self._held), "a parked token holds a lock"
        assert sorted(self._parked_on.values()) == sorted(lock for lock, q in self._parked.items() for _ in q)
        assert all(self._parked_on[t] == lock for lock, q in self._parked.items() for t in q)
        assert {(lock, id(t)) for lock, t in self._holders.items()} == {
            (lock, id(t)) for t, locks in self._held.items() for lock in locks}
