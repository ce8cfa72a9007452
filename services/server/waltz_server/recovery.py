"""Recovery decision core for one partition's new store session: classify replicas, vote, plan repairs."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Final

UNRESOLVED: Final = -(2**63)
"""ReplicaState.closing_high_water_mark of a replica whose session has not been closed (Java Long.MIN_VALUE)."""


@dataclass(frozen=True, slots=True)
class ReplicaState:
    """A replica's entry in the partition metadata (server-design.txt, "ReplicaState")."""

    session_id: int
    closing_high_water_mark: int


@dataclass(frozen=True, slots=True)
class ReplicaFacts:
    """What a reachable replica's storage reports: Last Session Info and its max transaction id.

    local_low_water_mark is carried for logging only; recovery does not use it (nor did the original).
    """

    session_id: int
    low_water_mark: int
    local_low_water_mark: int
    max_transaction_id: int
    damaged: frozenset[int] = frozenset()
    """Ids up to max_transaction_id that the replica holds but cannot serve (they fail their checksums)."""
    committed_high_water_mark: int = -1
    """The highest id the replica knows committed (its low-water mark or a high-water mark an append told it):
    it refuses a Truncate below it, and what it holds up to it is the committed log. -1: not reported."""


@dataclass(frozen=True, slots=True)
class Truncate:
    """Remove every transaction above transaction_id (storage Truncate), then report replica_progress."""

    transaction_id: int


@dataclass(frozen=True, slots=True)
class SetLowWaterMark:
    """Set the session's low-water mark on the replica (storage SetLowWaterMark), then report low_water_mark_set."""

    low_water_mark: int


@dataclass(frozen=True, slots=True)
class CatchUp:
    """Copy transactions first..last (inclusive) from replica source, reporting replica_progress per batch."""

    source: str
    first: int
    last: int


@dataclass(frozen=True, slots=True)
class Repair:
    """Rewrite the damaged transactions (ascending) with intact copies read from replica source (storage Repair),
    then report replica_repaired."""

    source: str
    transaction_ids: tuple[int, ...]


class WaitReason(Enum):
    OFFLINE = "offline"
    UNRESOLVED = "waiting for the closing high-water mark to be resolved"
    NO_SOURCE = "no reachable replica holds the transactions it lacks"
    NO_INTACT_COPY = "it holds damaged transactions that no reachable replica holds intact"


@dataclass(frozen=True, slots=True)
class Wait:
    """Nothing to do until the next event."""

    reason: WaitReason


@dataclass(frozen=True, slots=True)
class Recovered:
    """The replica is clean, holds exactly the resolved high-water mark and has this session's low-water mark."""


ReplicaAction = Truncate | Repair | SetLowWaterMark | CatchUp | Wait | Recovered

MAX_REPAIR_IDS = 100
"""Damaged transactions one Repair action rewrites at most."""


class Resolution(Enum):
    RESOLVED = "resolved"
    UNDECIDABLE = "undecidable"  # offline replicas could change the outcome: wait for them or for catch-up
    PENDING = "pending"  # no candidate has a quorum yet; catch-up (or a replica coming online) may give one


@dataclass(frozen=True, slots=True)
class RecoveryDecision:
    """What to do now. actions has one entry per assigned replica.

    complete: resolved and a quorum of the assigned replicas recovered; the store session may take appends,
    with high_water_mark as its low-water mark. replica_states: the partition metadata's new replica states,
    to be written (compare-and-set) whenever it differs from what was last written; None until complete.
    """

    resolution: Resolution
    high_water_mark: int | None
    actions: Mapping[str, ReplicaAction]
    recovered: frozenset[str]
    complete: bool
    replica_states: Mapping[str, ReplicaState] | None


class SessionFencedError(Exception):
    """A replica's storage is already in a newer store session than this recovery's: this session is stale."""


def resolve_high_water_mark(
    high_water_marks: Iterable[int], *, num_absent: int, quorum: int, floor: int
) -> tuple[Resolution, int | None]:
    """The seed's quorum check. A replica with high-water mark X votes for every H <= X; candidates at or
    above floor are examined in descending order; the first with quorum votes wins, but a candidate whose
    votes fall short while votes + num_absent reach the quorum makes the outcome undecidable."""
    marks = sorted(high_water_marks, reverse=True)
    for candidate in sorted({h for h in marks if h >= floor}, reverse=True):
        votes = sum(1 for h in marks if h >= candidate)
        if votes >= quorum:
            return Resolution.RESOLVED, candidate
        if votes + num_absent >= quorum:
            return Resolution.UNDECIDABLE, None
    return Resolution.PENDING, None


@dataclass(slots=True)
class _Replica:
    online: bool
    max_transaction_id: int
    is_new: bool  # not in the previous metadata: never votes
    proposal: int | None  # the max transaction id it proposed, if it may propose a closing high-water mark
    truncate_to: int | None  # pending truncation decided by classification
    low_water_mark_set: bool
    damaged: set[int]  # held but failing their checksums: never a source of these, repaired before recovered

    @property
    def high_water_mark(self) -> int:
        """What it holds once its pending truncation is done."""
        if self.truncate_to is None:
            return self.max_transaction_id
        return min(self.max_transaction_id, self.truncate_to)


class RecoveryManager:
    """Recovery of one partition for the new store session session_id (server-design.txt, Recovery Procedure).

    previous: the replica states read from the partition metadata (the previous session's replica set);
    assigned: the replicas (connect strings) of the new session. Drive it with events, then act on decide():

    1. replica_online(r, facts) when r's storage answered Last Session Info and Max Transaction ID;
       replica_offline(r) when the connection is lost.
    2. Call decide() after every event and run, one at a time per replica, the action it gives for r:
       Truncate -> replica_progress(r, max txn id now); SetLowWaterMark -> low_water_mark_set(r);
       CatchUp -> replica_progress(r, max) after each copied batch (the target may change in between);
       Wait / Recovered -> nothing until the next event.
    3. When decision.replica_states is not None and differs from what was last written, write it.
    4. When decision.complete, the session can take appends; keep driving the late replicas.

    Every event re-evaluates the vote; once resolved, the high-water mark never changes. decide() is a pure
    read of the state, so calling it twice gives the same decision.

    Voting, as the original: only a replica whose closing mark is unresolved and whose log reaches its
    low-water mark proposes a candidate (the lowest proposal is the lowest candidate examined), but every
    reachable replica of the previous set votes with what it holds: after its classification truncation,
    and more as it follows the most advanced replica. Without that, five replicas with one or two proposers
    could never reach a quorum of three. Replicas of the previous set that are unreachable or no longer
    assigned count as absent.

    Damage (issue 33, docs/failover.md "Damaged records"): a replica reports the ids it holds whose records fail
    their checksums. It votes with its max transaction id all the same, because a damaged record was written
    and acknowledged there: counting it as never written would let a vote truncate a transaction that a
    majority acknowledged (the issue's lost 400). It is never a source of a damaged id, and it is not recovered
    until each damaged id up to the resolved high-water mark is rewritten from a replica holding it intact
    (Repair); with no such replica reachable it waits (NO_INTACT_COPY) rather than guess.
    """

    def __init__(self, session_id: int, previous: Mapping[str, ReplicaState], assigned: Iterable[str]) -> None:
        self.session_id = session_id
        self._previous = dict(previous)
        self._assigned = tuple(sorted(set(assigned)))
        if not self._assigned:
            raise ValueError("a store session needs at least one replica")
        self._replicas: dict[str, _Replica] = {}
        self._previous_quorum = len(self._previous) // 2 + 1
        self._quorum = len(self._assigned) // 2 + 1
        self._resolution = Resolution.PENDING
        self._high_water_mark: int | None = None
        self._evaluate()

    @property
    def high_water_mark(self) -> int | None:
        """The resolved closing high-water mark of the previous session, or None while unresolved."""
        return self._high_water_mark

    def replica_online(self, replica: str, facts: ReplicaFacts) -> None:
        """Replica became reachable and its storage reported facts: classify it (again, if it reconnected)."""
        self._check_assigned(replica)
        if facts.session_id > self.session_id:
            raise SessionFencedError(f"{replica} is in session {facts.session_id} > {self.session_id}")
        self._replicas[replica] = self._classify(replica, facts)
        self._evaluate()

    def replica_offline(self, replica: str) -> None:
        """Replica became unreachable; what it achieved so far (recovered, clean) is remembered."""
        self._check_assigned(replica)
        state = self._replicas.get(replica)
        if state is not None:
            state.online = False
            self._evaluate()

    def replica_progress(self, replica: str, max_transaction_id: int) -> None:
        """Replica's max transaction id changed (after a truncation or a copied batch). Stale reports about an
        offline replica are ignored: its facts are read again when it reconnects."""
        self._check_assigned(replica)
        state = self._replicas.get(replica)
        if state is None or not state.online:
            return
        state.max_transaction_id = max_transaction_id
        state.damaged = {t for t in state.damaged if t <= max_transaction_id}
        if state.truncate_to is not None and max_transaction_id <= state.truncate_to:
            state.truncate_to = None
        self._evaluate()

    def replica_damage(self, replica: str, damaged: Iterable[int]) -> None:
        """Replica reported the damaged transactions it holds now (after a Repair, or when a read from it failed
        its checksums). Damage never changes the vote: see the class docstring."""
        self._check_assigned(replica)
        state = self._replicas.get(replica)
        if state is None or not state.online:
            return
        state.damaged = {t for t in damaged if t <= state.max_transaction_id}

    def low_water_mark_set(self, replica: str) -> None:
        """Replica's storage accepted SetLowWaterMark(high_water_mark) for this session."""
        self._check_assigned(replica)
        if self._high_water_mark is None:
            raise ValueError("the low-water mark cannot be set before the high-water mark is resolved")
        state = self._replicas.get(replica)
        if state is not None and state.online:
            state.low_water_mark_set = True

    def decide(self) -> RecoveryDecision:
        """The current decision: resolution, one action per assigned replica, and metadata to write."""
        actions = {r: self._action(r) for r in self._assigned}
        recovered = frozenset(r for r in self._assigned if self._is_recovered(r))
        complete = self._high_water_mark is not None and len(recovered) >= self._quorum
        return RecoveryDecision(
            resolution=self._resolution,
            high_water_mark=self._high_water_mark,
            actions=actions,
            recovered=recovered,
            complete=complete,
            replica_states=self._new_replica_states() if complete else None,
        )

    def _check_assigned(self, replica: str) -> None:
        if replica not in self._assigned:
            raise KeyError(f"{replica} is not assigned to this store session")

    def _classify(self, replica: str, facts: ReplicaFacts) -> _Replica:
        """The original's table: who truncates to what before voting, and who may propose."""
        max_id = facts.max_transaction_id
        previous = self._previous.get(replica)
        is_new = previous is None and bool(self._previous)
        truncate_to: int | None = None
        proposal: int | None = None
        if facts.session_id == self.session_id:
            # Only this recovery sets this session's low-water mark, after resolving and truncating.
            if self._high_water_mark is None:
                raise ValueError(f"{replica} is already in session {self.session_id} before resolution")
            return _Replica(True, max_id, is_new, None, None, True, set(facts.damaged))
        if previous is None:
            if is_new:
                truncate_to = facts.low_water_mark
        elif facts.session_id < previous.session_id:
            truncate_to = facts.low_water_mark  # storage restored or replaced: clean it, no proposal
        elif previous.closing_high_water_mark != UNRESOLVED:
            # Dirty tail of a session closed without it. Never below the low-water mark its storage recorded:
            # a later session's recovery set it (the metadata did not record that session) after copying the
            # committed prefix up to it there, and the storage node refuses to truncate below it.
            truncate_to = max(previous.closing_high_water_mark, facts.low_water_mark)
        elif max_id >= facts.low_water_mark:
            proposal = max_id  # may hold uncommitted transactions: it votes
        if truncate_to is not None:
            # What the replica knows committed is the log: keep it (its storage refuses to cut it anyway). A node
            # unassigned while running and assigned again is new here, yet appends told it more than its low-water
            # mark; truncating it to that mark was refused at every try and it never caught up.
            truncate_to = max(truncate_to, facts.committed_high_water_mark)
            if max_id <= truncate_to:
                truncate_to = None
        return _Replica(True, max_id, is_new, proposal, truncate_to, False, set(facts.damaged))

    def _evaluate(self) -> None:
        if self._high_water_mark is not None:
            return
        if not self._previous:
            self._resolution, self._high_water_mark = Resolution.RESOLVED, -1
            return
        voters = [s for r, s in self._replicas.items() if s.online and r in self._previous]
        proposals = [s.proposal for s in voters if s.proposal is not None]
        num_absent = len(self._previous) - len(voters)
        if not proposals:
            # Nothing to examine yet; only an absent replica could bring a candidate.
            self._resolution = Resolution.UNDECIDABLE if num_absent else Resolution.PENDING
            return
        self._resolution, self._high_water_mark = resolve_high_water_mark(
            (s.high_water_mark for s in voters),
            num_absent=num_absent,
            quorum=self._previous_quorum,
            floor=min(proposals),
        )

    def _source(self, at_least: int, exclude: str, first: int | None = None) -> str | None:
        """The most advanced reachable replica whose transactions up to at_least are valid, ties by name; one that
        holds first (default at_least) intact."""
        wanted = at_least if first is None else first
        candidates = [
            (-s.max_transaction_id, r)
            for r, s in self._replicas.items()
            if r != exclude
            and s.online
            and s.truncate_to is None
            and s.max_transaction_id >= at_least
            and wanted not in s.damaged
            and (not s.is_new or s.low_water_mark_set)
        ]
        return min(candidates)[1] if candidates else None

    def _catch_up(self, source: str, first: int, last: int) -> CatchUp:
        """Copy first..last from source, stopping before the first transaction the source holds damaged."""
        damaged = [t for t in self._replicas[source].damaged if first <= t <= last]
        return CatchUp(source, first, min(damaged, default=last + 1) - 1)

    def _repair(self, replica: str, damaged: list[int]) -> ReplicaAction:
        """Repair the damaged transactions (ascending) from the source that holds the first of them intact."""
        source = self._source(damaged[0], replica)
        if source is None:
            return Wait(WaitReason.NO_INTACT_COPY)
        held = self._replicas[source]
        fixable = (t for t in damaged if t <= held.max_transaction_id and t not in held.damaged)
        return Repair(source, tuple(fixable)[:MAX_REPAIR_IDS])

    def _action(self, replica: str) -> ReplicaAction:
        state = self._replicas.get(replica)
        if state is None or not state.online:
            return Wait(WaitReason.OFFLINE)
        resolved = self._high_water_mark
        if state.truncate_to is not None:
            target = state.truncate_to if resolved is None else min(state.truncate_to, resolved)
            return Truncate(target)
        mark = state.max_transaction_id
        if resolved is None:
            # Before resolution a replica in the vote follows the most advanced one, as the original's
            # "usher": that is how a behind or once-truncated replica makes a candidate decidable.
            usher = None if state.is_new else self._source(mark + 1, replica)
            if usher is None:
                return Wait(WaitReason.UNRESOLVED)
            return self._catch_up(usher, mark + 1, self._replicas[usher].max_transaction_id)
        if mark > resolved:
            return Truncate(resolved)
        if state.damaged:
            return self._repair(replica, sorted(state.damaged))
        if mark < resolved:
            # Caught up before its low-water mark is set: a storage node refuses a low-water mark above what
            # it holds (the mark says everything up to it is held here).
            source = self._source(resolved, replica, mark + 1)
            if source is None:
                return Wait(WaitReason.NO_SOURCE)
            return self._catch_up(source, mark + 1, resolved)
        if not state.low_water_mark_set:
            return SetLowWaterMark(resolved)
        return Recovered()

    def _is_clean(self, replica: str) -> bool:
        state = self._replicas.get(replica)
        return (
            state is not None
            and state.low_water_mark_set
            and state.truncate_to is None
            and not state.damaged
            and self._high_water_mark is not None
            and state.max_transaction_id <= self._high_water_mark
        )

    def _is_recovered(self, replica: str) -> bool:
        return self._is_clean(replica) and self._replicas[replica].max_transaction_id == self._high_water_mark

    def _new_replica_states(self) -> dict[str, ReplicaState]:
        """server-design.txt, "Update Partition Metadata"; replicas no longer assigned are dropped."""
        resolved = self._high_water_mark
        assert resolved is not None
        states: dict[str, ReplicaState] = {}
        for replica in self._assigned:
            previous = self._previous.get(replica)
            if self._is_clean(replica):
                states[replica] = ReplicaState(self.session_id, UNRESOLVED)
            elif previous is None:
                states[replica] = ReplicaState(-1, resolved)
            elif previous.closing_high_water_mark == UNRESOLVED and previous.session_id < self.session_id:
                states[replica] = ReplicaState(previous.session_id, resolved)
            else:
                states[replica] = previous
        return states
