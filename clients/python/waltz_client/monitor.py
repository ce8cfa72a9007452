"""Per-partition registry of pending appends that infers each one's success or failure."""

from __future__ import annotations

from collections.abc import Sequence
from enum import Enum
from typing import Generic, NamedTuple, Protocol, TypeVar

from waltz_common.types import ReqId

T = TypeVar("T")

SUPERSEDED = "a later append from this client committed first"
FLUSHED = "not in the feed up to the flush high-water mark"
CLEARED = "monitor cleared"
LOCK_FAILURE = "lock failure"  # how the reason of an outcome that a lock failure caused begins

FINAL_FOR_A_RESEND = frozenset({"SEQUENCE_NOT_INCREASING", "INVALID", "PERMISSION_DENIED"})
"""The rejections that prove an append sent more than once can never commit: the server saw its sequence number
(or a later one) and holds no commit of it, the request itself is malformed, or its client id belongs to another
identity. Any other rejection of a re-sent append (the partition not ready, not mounted, another generation) is about
that one send only: an earlier send of the same sequence number may still be decided by a recovery, so the append
stays pending and is sent again."""


class OutcomeKind(Enum):
    COMMITTED = "committed"  # final; transaction_id is the commit's id
    FAILED = "failed"  # final; reason says why; the shell may retry the transaction
    LOCK_FAILED = "lock_failed"  # notice only; transaction_id caused it; FAILED follows later


class Outcome(NamedTuple):  # immutable like a frozen dataclass, and made several times faster
    kind: OutcomeKind
    transaction_id: int | None = None
    reason: str = ""

    @property
    def is_final(self) -> bool:
        return self.kind is not OutcomeKind.LOCK_FAILED

    @staticmethod
    def committed(transaction_id: int) -> Outcome:
        return Outcome(OutcomeKind.COMMITTED, transaction_id)

    @staticmethod
    def failed(reason: str) -> Outcome:
        return Outcome(OutcomeKind.FAILED, reason=reason)

    @staticmethod
    def lock_failed(transaction_id: int) -> Outcome:
        return Outcome(OutcomeKind.LOCK_FAILED, transaction_id, LOCK_FAILURE)


class CapacityError(RuntimeError):
    """register() was called while the monitor was full; wait for has_capacity()."""


class ReqIdFields(Protocol):
    """A ReqId, or its protobuf message: the feed's entries are looked up without converting them."""

    @property
    def client_id(self) -> int: ...
    @property
    def generation(self) -> int: ...
    @property
    def partition_id(self) -> int: ...
    @property
    def seq_num(self) -> int: ...


def _seq_not_after(a: ReqIdFields, b: ReqIdFields) -> bool:
    """a was created no later than b by the same client for the same partition (int32 wrap)."""
    same_origin = a.client_id == b.client_id and a.partition_id == b.partition_id
    return same_origin and (b.seq_num - a.seq_num) & 0xFFFFFFFF < 2**31


class TransactionMonitor(Generic[T]):
    """Pending appends of one partition, in registration order; no I/O.

    Every registered entry gets exactly one final outcome (COMMITTED or FAILED) and, before
    it, at most one LOCK_FAILED notice. Each event returns the (token, outcome) pairs it
    produced, for the shell to fire callbacks with in list order. Shell usage:

      - start: `TransactionMonitor(max_concurrent, client_high_water_mark=<application's>)`.
      - submit: wait until `has_capacity()`, then `register(req_id, token, now)` (ReqIds from
        ClientPartitionState.next_req_id, whose sequence numbers order them and tell them
        apart: entries are kept by sequence number; req_id may be any object with a ReqId's
        four fields that keeps them until the entry is resolved), then send.
      - FeedData that ClientPartitionState.accept_feed answers APPLY: `on_feed(req_id, txn_id)`
        (req_id may be the protobuf ReqId),
        fire its outcomes (a commit's onCompletion before applyTransaction), apply the
        transaction, then `on_client_high_water_mark(txn_id)`. For SKIP_DUPLICATE call only
        `on_feed` (the record proves the commit); for GAP call nothing (it is fed again).
      - MountResponse READY (after the catch-up feed was applied): `take_resends(now)`, send those tokens again
        with their sequence numbers (before any new append), then `on_mount_complete()`.
      - LockFailure: `on_lock_failure(req_id, txn_id)`.
      - FlushResponse: `on_flush_response(req_id, hwm, client_hwm)`; the monitor remembers it
        and resolves it when a later `on_client_high_water_mark` reaches hwm (calling again
        with the same response is harmless).
      - append refused by the server before enqueueing: `on_rejected(req_id, reason, transaction_id)`.
      - timer: if `oldest_pending_age(now)` exceeds the long-wait threshold, send a
        FlushRequest with the ReqId `flush_target()`.
      - close: `clear()`.

    A lock-failed entry stays registered (and counts against capacity) until the client
    hwm reaches the conflicting transaction (feed, mount and flush events leave it alone),
    so a retry runs against state at least that fresh.

    The rule for FAILED (the shell then executes the transaction again, under a new sequence number): only on the
    server's proof that the append can never commit: a flush answered after every earlier append of the client
    was decided, a later append of the client committed (a client's sequence numbers are admitted in increasing
    order only), a rejection naming the append (for an append sent more than once, only FINAL_FOR_A_RESEND), or a
    lock failure. A remount proves nothing: entries still waiting then are sent again with the same sequence
    numbers (take_resends), and the server answers ALREADY_COMMITTED for one that committed after all. Entries
    are matched by client, partition and sequence number: sequence numbers never repeat, whatever the generation.
    """

    def __init__(self, max_concurrent: int = 5, client_high_water_mark: int = -1) -> None:
        if max_concurrent < 1:
            raise ValueError("max_concurrent must be at least 1")
        self.max_concurrent = max_concurrent
        self._client_hwm = client_high_water_mark
        # by sequence number (an int hashes faster than a ReqId): (token, registered at, its ReqId); a tuple
        # is the cheapest record there is, and the common path makes one per append
        self._entries: dict[int, tuple[T, float, ReqIdFields]] = {}
        self._flushes: list[tuple[ReqIdFields, int]] = []  # (up to ReqId, hwm) not yet reached
        self._lock_failures: dict[int, int] = {}  # sequence number -> the transaction it conflicted with
        self._resent: set[int] = set()  # sequence numbers sent again since they were registered

    @property
    def client_high_water_mark(self) -> int:
        return self._client_hwm

    def has_capacity(self) -> bool:
        return len(self._entries) < self.max_concurrent

    def pending_count(self) -> int:
        return len(self._entries)

    def register(self, req_id: ReqIdFields, token: T, now: float) -> None:
        entries = self._entries
        if len(entries) >= self.max_concurrent:
            raise CapacityError(f"{self.max_concurrent} transactions already pending")
        seq_num = req_id.seq_num
        if seq_num in entries:
            raise ValueError(f"{req_id}: its sequence number is already registered")
        entries[seq_num] = (token, now, req_id)

    def register_all(self, tokens: Sequence[T], now: float) -> None:
        """register(token, token, now) for each token, in order, for tokens that are their own ReqIds (any
        object with a ReqId's four fields); CapacityError before any is registered if they do not all fit."""
        entries = self._entries
        if len(entries) + len(tokens) > self.max_concurrent:
            raise CapacityError(f"{len(tokens)} more than the {self.max_concurrent} transactions allowed pending "
                                f"({len(entries)} already)")
        for token in tokens:
            seq_num = token.seq_num  # type: ignore[attr-defined]  # a ReqIdFields
            if seq_num in entries:
                raise ValueError(f"{token}: its sequence number is already registered")
            entries[seq_num] = (token, now, token)  # type: ignore[assignment]  # a ReqIdFields

    def commit_oldest(self, seq_num: int) -> T | None:
        """The common case of on_feed, for the shell's feed loop, given a fed ReqId's sequence number once the
        shell has checked its client and partition are those of every entry (they are the shell's own appends;
        the generation does not matter, as for on_feed): if it is the oldest pending entry, resolve it as
        committed and return its token (nothing older can fail); otherwise change nothing and return None (then
        call on_feed)."""
        entries = self._entries
        entry = entries.get(seq_num)
        if entry is None or next(iter(entries)) != seq_num:
            return None
        del entries[seq_num]
        if self._lock_failures:
            self._lock_failures.pop(seq_num, None)
        if self._resent:
            self._resent.discard(seq_num)
        return entry[0]

    def on_feed(self, req_id: ReqIdFields, transaction_id: int) -> list[tuple[T, Outcome]]:
        """A transaction in the feed: if ours, it committed and older waiting entries failed."""
        if self._find(req_id) is None:
            return []
        seq_num = req_id.seq_num
        lock_failures = self._lock_failures
        older = []
        for seq in self._entries:
            if seq == seq_num:
                break
            if seq not in lock_failures:
                older.append(seq)
        resolved = [self._resolve(seq, Outcome.failed(SUPERSEDED)) for seq in older]
        resolved.append(self._resolve(seq_num, Outcome.committed(transaction_id)))
        return resolved

    def take_resends(self, now: float) -> list[T]:
        """A mount completed (its catch-up feed applied): the entries still waiting for the server (not lock-failed),
        oldest first, to send again with their sequence numbers. They stay registered (registered again at now)."""
        tokens = []
        lock_failures = self._lock_failures
        for seq, (token, _, req_id) in list(self._entries.items()):
            if seq not in lock_failures:
                self._entries[seq] = (token, now, req_id)
                self._resent.add(seq)
                tokens.append(token)
        return tokens

    def on_mount_complete(self) -> list[tuple[T, Outcome]]:
        """Flush answers heard under the earlier mount are forgotten (nothing waits for them any more)."""
        self._flushes.clear()
        return self._release()

    def on_flush_response(
        self, up_to_req_id: ReqIdFields, high_water_mark: int, client_high_water_mark: int
    ) -> list[tuple[T, Outcome]]:
        """Appends up to up_to_req_id are done at the server; those not fed by hwm failed."""
        if (up_to_req_id, high_water_mark) not in self._flushes:
            self._flushes.append((up_to_req_id, high_water_mark))
        return self.on_client_high_water_mark(client_high_water_mark)

    def on_lock_failure(self, req_id: ReqIdFields, transaction_id: int) -> list[tuple[T, Outcome]]:
        """Notify at once; the FAILED outcome waits until the client hwm >= transaction_id."""
        entry = self._find(req_id)
        if entry is None or req_id.seq_num in self._lock_failures:
            return []
        self._lock_failures[req_id.seq_num] = transaction_id
        return [(entry[0], Outcome.lock_failed(transaction_id)), *self._release()]

    def on_client_high_water_mark(self, high_water_mark: int) -> list[tuple[T, Outcome]]:
        """The application has applied everything up to high_water_mark."""
        self._client_hwm = max(self._client_hwm, high_water_mark)
        return self._release()

    def on_rejected(self, req_id: ReqIdFields, reason: str, transaction_id: int = -1) -> list[tuple[T, Outcome]]:
        """The server refused the append without enqueueing it (reason: the AppendRejected.Reason's name).
        ALREADY_COMMITTED (a re-send of an append that committed as transaction_id) is no failure: COMMITTED if
        the client applied that transaction already, else nothing (the feed brings it)."""
        if self._find(req_id) is None:
            return []
        seq_num = req_id.seq_num
        if reason == "ALREADY_COMMITTED":
            if 0 <= transaction_id <= self._client_hwm:
                return [self._resolve(seq_num, Outcome.committed(transaction_id))]
            return []
        if seq_num in self._resent and reason not in FINAL_FOR_A_RESEND:
            return []
        return [self._resolve(seq_num, Outcome.failed(f"rejected: {reason}"))]

    def oldest_pending_age(self, now: float) -> float | None:
        """Age of the oldest entry still waiting for the server (not lock-failed), if any."""
        times = [e[1] for seq, e in self._entries.items() if seq not in self._lock_failures]
        return now - min(times) if times else None

    def flush_target(self) -> ReqId | None:
        """The newest entry waiting for the server: a flush up to it covers all of them."""
        waiting = [e[2] for seq, e in self._entries.items() if seq not in self._lock_failures]
        if not waiting:
            return None
        r = waiting[-1]
        return r if type(r) is ReqId else ReqId(r.client_id, r.generation, r.partition_id, r.seq_num)

    def clear(self) -> list[tuple[T, Outcome]]:
        """End every entry (the client is closing: their outcome is unknown) and forget pending flushes."""
        self._flushes.clear()
        return [self._resolve(seq, Outcome.failed(CLEARED)) for seq in list(self._entries)]

    def _find(self, req_id: ReqIdFields) -> tuple[T, float, ReqIdFields] | None:
        entry = self._entries.get(req_id.seq_num)
        if entry is None:
            return None
        mine = entry[2]
        same = mine.client_id == req_id.client_id and mine.partition_id == req_id.partition_id
        return entry if same else None

    def _resolve(self, seq_num: int, outcome: Outcome) -> tuple[T, Outcome]:
        entry = self._entries.pop(seq_num)
        if self._lock_failures:
            self._lock_failures.pop(seq_num, None)
        if self._resent:
            self._resent.discard(seq_num)
        return entry[0], outcome

    def _release(self) -> list[tuple[T, Outcome]]:
        """Fail what the client hwm now allows: reached flushes, and caught-up lock failures."""
        if not self._flushes and not self._lock_failures:
            return []  # the common case, after every applied feed batch: nothing can be due
        reached = [up_to for up_to, hwm in self._flushes if hwm <= self._client_hwm]
        self._flushes = [(up_to, hwm) for up_to, hwm in self._flushes if hwm > self._client_hwm]
        due: dict[int, Outcome] = {}
        for seq, entry in self._entries.items():
            conflict = self._lock_failures.get(seq)
            if conflict is not None:
                if conflict <= self._client_hwm:
                    due[seq] = Outcome.failed(f"{LOCK_FAILURE}: conflict with transaction {conflict}")
            elif any(_seq_not_after(entry[2], up_to) for up_to in reached):
                due[seq] = Outcome.failed(FLUSHED)
        return [self._resolve(seq, outcome) for seq, outcome in due.items()]
