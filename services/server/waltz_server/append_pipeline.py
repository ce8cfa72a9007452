"""The append decision core of one partition: lock checks, in-flight waits, batching, resolution.

No I/O. The partition shell offers validated appends in arrival order, takes batches for the
store (up to ``max_in_flight`` at a time, resolved in the order they were taken) and reports each
batch's outcome; every call answers what happened to which appends, for the shell to tell
clients and feeds.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from waltz_server.locks import LockRequest, LockTable

T = TypeVar("T")


class Ticketed(Protocol):
    """An append as ClientPending.resolved_all reads it (a QueuedAppend)."""

    @property
    def client_id(self) -> int: ...

    @property
    def ticket(self) -> int: ...


@dataclass(slots=True, eq=False)
class QueuedAppend(Generic[T]):
    """One validated append with what the core needs; `origin` is opaque to the core."""

    client_id: int
    client_high_water_mark: int
    locks: LockRequest
    size: int
    origin: T
    ticket: int = 0
    """Its place among its client's appends offered to the partition (ClientPending.offered)."""
    checked: int = -1
    """The lock table's version when its lock check last passed: until the version moves, it still passes."""

    @property
    def all_locks(self) -> tuple[int, ...]:
        return self.locks.write + self.locks.read + self.locks.append

    @property
    def has_locks(self) -> bool:
        return self.locks.any


A = TypeVar("A", bound=QueuedAppend[Any])
"""What an AppendPipeline queues: a QueuedAppend (or a subclass with the shell's fields)."""


class Send(enum.Enum):
    """When the shell sends the next batch, told by AppendPipeline.pace() after appends were offered."""

    NOW = "now"
    """From the offer's own stack: the partition is quiet (its last batch was one client message's, and nothing
    waited behind it), so nothing else is coming to join it."""
    NEXT_TURN = "next turn"
    """After the event loop's next turn, with the appends the clients' other messages bring in this one: the
    partition is busy, and a batch sent at once would leave them a whole round behind it (group commit)."""
    LATER = "later"
    """Not now: max_in_flight batches are out (the commit that frees one sends it), or nothing is ready."""


@dataclass(frozen=True, slots=True)
class Resolved(Generic[A]):
    """The outcome of a batch: committed appends with their ids, and appends that failed."""

    committed: list[tuple[A, int]]
    failed: list[A]
    lock_failures: list[tuple[A, int]]
    """Appends that waited on the batch's locks (AppendPipeline: doomed): answer LockFailure with the id, around the
    publication of the batch's commits as answer_order() says."""

    def answer_order(self) -> tuple[list[tuple[A, int]], list[tuple[A, int]]]:
        """The lock failures to answer before the batch's commits are published, and those after. A client hears its
        appends' outcomes in order, so a doomed append whose client has an append among the commits is answered
        first. Any other after the feed: its client needs the failure and the conflicting commit applied before it
        executes again, and the feed then is not one stream write behind the failure, which it was for every client
        but the committer's (issue 31: the instance that committed read each commit 3.5 ms (p50) before the others,
        and made 78-85% of the next commits on the same item, where a third is fair)."""
        if not self.lock_failures:
            return [], []
        clients = {item.client_id for item, _ in self.committed}
        first = [failure for failure in self.lock_failures if failure[0].client_id in clients]
        if len(first) == len(self.lock_failures):
            return first, []
        return first, [failure for failure in self.lock_failures if failure[0].client_id not in clients]


class ClientPending(Generic[T]):
    """Per client, its unresolved queued appends and the flushes waiting for them.

    Each offered append gets the client's next ticket. A client's appends usually resolve in the order they were
    offered, but not always: a later append with locks may fail its lock check at once while an earlier one without
    locks is still at the store. So a waiter (a flush, a mount, a re-sent append) waits until every append offered
    before it resolved, whatever the order in which they did: counting resolutions would answer a flush while an
    earlier append can still commit, and the client would execute that one again (issue 24's double commit).
    """

    def __init__(self) -> None:
        self._offered: dict[int, int] = {}  # client -> the next ticket
        self._low: dict[int, int] = {}  # client -> every ticket below it resolved
        self._ahead: dict[int, set[int]] = {}  # client -> tickets resolved at or above its low mark
        self._waiters: dict[int, list[tuple[int, T]]] = {}

    def offered(self, client_id: int) -> int:
        """One more append of the client is queued; returns its ticket (for resolved)."""
        ticket = self._offered.get(client_id, 0)
        self._offered[client_id] = ticket + 1
        return ticket

    def pending(self, client_id: int) -> int:
        ahead = self._ahead.get(client_id)
        return self._offered.get(client_id, 0) - self._low.get(client_id, 0) - (len(ahead) if ahead else 0)

    def add_waiter(self, client_id: int, waiter: T) -> bool:
        """Wait for every append of the client offered so far; True when they all resolved (done already)."""
        target = self._offered.get(client_id, 0)
        if self._low.get(client_id, 0) >= target:
            return True
        self._waiters.setdefault(client_id, []).append((target, waiter))
        return False

    def resolved(self, client_id: int, ticket: int) -> list[T]:
        """The client's append with this ticket resolved; returns the waiters that are now done."""
        return self._resolved_run(client_id, ticket, ticket + 1)

    def resolved_all(self, appends: Iterable[Ticketed]) -> list[T]:
        """Every one of these appends resolved (a batch's, in any order); returns the waiters that are now done.

        The same as resolved() for each, done per run: a batch holds a client's appends mostly as consecutive
        tickets, and each such run of a client is one step, not one per append."""
        runs: dict[int, list[int]] = {}  # client -> [first, end) of the run being gathered
        reached: list[T] = []
        for append in appends:
            client_id, ticket = append.client_id, append.ticket
            run = runs.get(client_id)
            if run is not None:
                if run[1] == ticket:
                    run[1] = ticket + 1
                    continue
                reached += self._resolved_run(client_id, run[0], run[1])
            runs[client_id] = [ticket, ticket + 1]
        for client_id, (first, end) in runs.items():
            reached += self._resolved_run(client_id, first, end)
        return reached

    def _resolved_run(self, client_id: int, first: int, end: int) -> list[T]:
        """The client's appends with tickets first .. end - 1 resolved; the waiters now done."""
        low = self._low.get(client_id, 0)
        if first != low:
            if first > low:  # an earlier one is still unresolved
                self._ahead.setdefault(client_id, set()).update(range(first, end))
            return []
        low = end
        ahead = self._ahead.get(client_id)
        if ahead:
            while low in ahead:
                ahead.remove(low)
                low += 1
            if not ahead:
                del self._ahead[client_id]
        reached: list[T] = []
        waiters = self._waiters.get(client_id)
        if waiters:
            reached = [w for target, w in waiters if target <= low]
            if reached:
                kept = [(t, w) for t, w in waiters if t > low]
                if kept:
                    self._waiters[client_id] = kept
                else:
                    del self._waiters[client_id]
        if low == self._offered.get(client_id):  # nothing outstanding: tickets start again from 0
            del self._offered[client_id]
            self._low.pop(client_id, None)
        else:
            self._low[client_id] = low
        return reached

    def drop_waiters(self) -> list[T]:
        """Every waiter (the partition is closing)."""
        waiters = [w for ws in self._waiters.values() for _, w in ws]
        self._waiters.clear()
        return waiters


class AppendPipeline(Generic[A]):
    """Queued appends -> lock check -> the next batch -> batches at the store -> resolution.

    An append whose locks meet an in-flight (accepted, unresolved) transaction's locks waits
    until that one resolves, because only its outcome decides the lock check. Appends that do
    not touch a waiting append's client or locks pass it; those that do stay behind it, so a
    client's appends resolve in order and conflicting appends are served first come, first served.
    Except a lock failure: an append whose check fails on what committed already is answered at once,
    not after the appends it waits behind (committed marks only grow: their outcome cannot save it).
    And a doomed append: one whose write or read lock is a write or append lock of an in-flight append (the same
    lock, not only a shared slot). Whatever it does, the in-flight one's commit fails it: that commit's id is above
    every id the client can have seen (the shell refuses a client high-water mark above the partition's). It leaves
    the queue at once, blocking neither its client's later appends nor anyone's, and is answered LockFailure when
    the in-flight append resolves (Resolved.lock_failures): with its id if it committed, else with committed_up_to
    (a false conflict, which the lock rules allow: a doomed append never commits). Without this rule an instance
    whose append queued behind another's in-flight transaction on a hot lock held all its later appends on other
    locks behind it, while the instance that held the lock went on (issue 31: most commits went to the instances
    that happened to have no append queued).
    """

    def __init__(self, locks: LockTable, max_batch_size: int, max_batch_bytes: int, max_in_flight: int = 1) -> None:
        if max_in_flight < 1:
            raise ValueError("at least one batch must be allowed in flight")
        self._locks = locks
        self._max_in_flight = max_in_flight
        self._max_count = max_batch_size
        self._max_bytes = max_batch_bytes
        self._waiting: deque[A] = deque()
        self._scanned = 0  # waiting[:scanned] were examined since the last change that could free them
        self._blocked_clients: set[int] = set()
        self._blocked_locks: set[int] = set()
        self._building: list[A] = []
        self._building_bytes = 0
        self._building_locked = 0  # appends with locks in the batch being built (none: no per-append lock work)
        self._in_flight: deque[list[A]] = deque()  # oldest first
        self._in_flight_locked: deque[int] = deque()  # of each, the appends with locks
        self._in_flight_count = 0
        self._holders: dict[int, A] = {}  # lock hash -> the in-flight append writing or appending it
        self._doomed: dict[int, list[A]] = {}  # lock hash -> appends failed by its holder's outcome
        self._doomed_count = 0
        self._busy = False  # the last batch taken held several messages' appends, or appends waited behind it

    def __len__(self) -> int:
        """Appends queued and not yet resolved (waiting, batched or at the store)."""
        return len(self._waiting) + len(self._building) + self._in_flight_count + self._doomed_count

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    @property
    def untaken(self) -> bool:
        """Appends wait or are batched that the store has not taken yet (what a resolved batch can let go)."""
        return bool(self._waiting or self._building)

    @property
    def doomed(self) -> int:
        """Appends out of the queue, to be answered LockFailure when the in-flight append holding their lock
        resolves."""
        return self._doomed_count

    @property
    def in_flight(self) -> int:
        """Batches taken for the store and not resolved yet."""
        return len(self._in_flight)

    def offer(self, append: A) -> None:
        self._waiting.append(append)

    def poll(self) -> list[tuple[A, int]]:
        """Lock-check the waiting appends that may go now; returns the lock failures."""
        failures: list[tuple[A, int]] = []
        waiting = self._waiting
        if self._scanned == len(waiting):
            return failures  # nothing new, and nothing resolved that could free what waits
        kept: deque[A] = deque()
        for _ in range(self._scanned):
            kept.append(waiting.popleft())
        # the loop runs once per append: the checks of an append without locks are written out inline
        blocked_clients, blocked_locks = self._blocked_clients, self._blocked_locks
        building, max_count, max_bytes = self._building, self._max_count, self._max_bytes
        building_bytes, building_locked = self._building_bytes, self._building_locked
        locks = self._locks
        version = locks.version
        holders = self._holders
        while waiting:
            item = waiting.popleft()
            locked = item.locks.any  # most appends take no locks: skip the table for them
            # a check that fails on what committed fails whatever the appends before it do: it is answered at once,
            # also behind a blocking append; one that passed passes until a commit moves a mark (the table's version)
            if locked and item.checked != version:
                conflict = locks.check(item.locks, item.client_high_water_mark)
                if conflict is not None:
                    failures.append((item, conflict))
                    continue
                item.checked = version
            if locked and holders:
                held = next((h for h in item.locks.checked if h in holders), None)
                if held is not None:  # doomed: the holder's commit fails it, also behind a blocking append
                    self._doomed.setdefault(held, []).append(item)
                    self._doomed_count += 1
                    continue
            if item.client_id in blocked_clients or (
                locked and blocked_locks and not blocked_locks.isdisjoint(item.all_locks)
            ):
                self._block(item)
                kept.append(item)
                continue
            if len(building) >= max_count or (building and building_bytes + item.size > max_bytes):
                self._block(item)
                kept.append(item)
                continue
            if locked and not locks.begin(item.locks):
                self._block(item)
                kept.append(item)
                continue
            building.append(item)
            building_bytes += item.size
            building_locked += locked
        self._building_bytes, self._building_locked = building_bytes, building_locked
        self._waiting = kept
        self._scanned = len(kept)
        return failures

    def pace(self) -> Send:
        """When the batch that the appends just offered (and polled) make goes to the store: Send.NOW while the
        partition is quiet, Send.NEXT_TURN while it is busy, Send.LATER while none can go.

        A lone writer's append goes at once, with no loop turn in its round. Under load a batch sent at once carries
        only the message that found the store idle, and the appends of the messages arriving just behind it wait a
        whole round: more rounds, each costing every process (the replicas, the feed to every client) as much as a
        full one, which is what made the open loop fall behind at 5,000-10,000 appends/s offered."""
        if len(self._in_flight) >= self._max_in_flight or not self._building:
            return Send.LATER
        return Send.NEXT_TURN if self._busy else Send.NOW

    def take_batch(self) -> list[A] | None:
        """The next batch for the store, when one is ready and fewer than max_in_flight are out."""
        if len(self._in_flight) >= self._max_in_flight or not self._building:
            return None
        batch, self._building, self._building_bytes = self._building, [], 0
        self._busy = batch[0].origin is not batch[-1].origin  # (a message's appends are offered together)
        locked, self._building_locked = self._building_locked, 0
        if locked:
            holders = self._holders
            for item in batch:
                if item.locks.any:
                    for h in item.locks.recorded:
                        holders[h] = item
        self._in_flight.append(batch)
        self._in_flight_locked.append(locked)
        self._in_flight_count += len(batch)
        self._rescan()
        return batch

    def committed(self, first_transaction_id: int) -> Resolved[A]:
        """The oldest in-flight batch committed with dense ids from first_transaction_id."""
        size = len(self._in_flight[0]) if self._in_flight else 0
        return self.failed(first_transaction_id, first_transaction_id + size - 1)

    def failed(self, first_transaction_id: int, committed_up_to: int) -> Resolved[A]:
        """The oldest in-flight batch broke; its appends with an id at or below committed_up_to committed."""
        batch = self._in_flight.popleft() if self._in_flight else []
        locked = self._in_flight_locked.popleft() if self._in_flight_locked else 0
        self._in_flight_count -= len(batch)
        kept = max(0, min(len(batch), committed_up_to - first_transaction_id + 1))
        ids = range(first_transaction_id, first_transaction_id + kept)
        committed: list[tuple[A, int]] = list(zip(batch[:kept], ids, strict=True))
        failed = batch[kept:]
        lock_failures: list[tuple[A, int]] = []
        holders, doomed = self._holders, self._doomed
        for offset, item in enumerate(batch if locked else ()):
            if item.locks.any:
                if offset < kept:
                    self._locks.commit(item.locks, first_transaction_id + offset)
                self._locks.end(item.locks)
                conflict = first_transaction_id + offset if offset < kept else committed_up_to
                for h in item.locks.recorded:
                    if holders.get(h) is item:
                        del holders[h]
                        for waiter in doomed.pop(h, ()):
                            lock_failures.append((waiter, conflict))
        self._doomed_count -= len(lock_failures)
        if self._waiting or self._building:
            self._busy = True
        self._rescan()
        return Resolved(committed, failed, lock_failures)

    def drop(self, which: Callable[[A], bool]) -> list[A]:
        """Remove the waiting and batched (not in-flight) appends `which` selects; returns them."""
        dropped = [item for item in self._waiting if which(item)]
        self._waiting = deque(item for item in self._waiting if not which(item))
        batched = [item for item in self._building if which(item)]
        for item in batched:
            if item.has_locks:
                self._locks.end(item.locks)
        self._building = [item for item in self._building if not which(item)]
        self._building_bytes = sum(item.size for item in self._building)
        self._building_locked = sum(item.locks.any for item in self._building)
        doomed = [item for waiters in self._doomed.values() for item in waiters if which(item)]
        if doomed:
            for h, waiters in list(self._doomed.items()):
                self._doomed[h] = [item for item in waiters if not which(item)]
            self._doomed_count -= len(doomed)
        self._rescan()
        return dropped + batched + doomed

    def _block(self, item: A) -> None:
        self._blocked_clients.add(item.client_id)
        self._blocked_locks.update(item.all_locks)

    def _rescan(self) -> None:
        self._scanned = 0
        self._blocked_clients.clear()
        self._blocked_locks.clear()
