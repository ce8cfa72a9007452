"""Decisions that keep operator tools from losing acknowledged transactions (pure: no ZooKeeper, no gRPC).

What ZooKeeper says about a partition (its PartitionView) decides who votes in the next store session's
recovery: every replica listed in the partition metadata's replica states is in the previous replica set,
and a replica whose closing high-water mark is still unresolved may hold acknowledged transactions that
only a majority of that set can prove. The guards below refuse the operations that would break that.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from waltz_common.zk import UNRESOLVED


@dataclass(frozen=True)
class ReplicaState:
    """One entry of the partition metadata's replica states."""

    session_id: int
    closing_high_water_mark: int


@dataclass(frozen=True)
class PartitionView:
    """One partition as ZooKeeper holds it: its store session, replica states and assigned replicas."""

    partition_id: int
    session_id: int
    states: Mapping[str, ReplicaState]
    assigned: frozenset[str]

    def is_voting_member(self, node: str) -> bool:
        """Listed with an unresolved closing high-water mark: its log may hold acknowledged transactions."""
        state = self.states.get(node)
        return state is not None and state.closing_high_water_mark == UNRESOLVED

    @property
    def quorum(self) -> int:
        """Replicas of the previous set the next recovery needs (0 when no session ever recorded states)."""
        return len(self.states) // 2 + 1 if self.states else 0


@dataclass(frozen=True)
class Refusal:
    """Why an operation is refused, what to do instead, and what --force would risk (None: no --force)."""

    reason: str
    remedy: str
    risk: str | None = None

    def message(self, forceable: bool = True) -> str:
        text = f"{self.reason}: {self.remedy}"
        if forceable and self.risk is not None:
            text += f" (--force does it anyway: {self.risk})"
        return text


def recover_destination(view: PartitionView, destination: str) -> Refusal | None:
    """recover-partition truncates the destination to its local low-water mark and stamps it with the current
    session: on a voting member that can drop acknowledged transactions from the next vote."""
    if not view.is_voting_member(destination):
        return None
    return Refusal(
        f"{destination} is a member of partition {view.partition_id}'s store session {view.session_id} in "
        "ZooKeeper: recovering onto it could truncate acknowledged transactions",
        f"unassign it first (waltz storage unassign -s {destination} -p {view.partition_id}), wait until the "
        "partition's next store session is running without it, then recover it",
    )


def create_on_voter(view: PartitionView, node: str) -> Refusal | None:
    """Creating a partition's (empty) files on a node that ZooKeeper lists as a voting member of it: the node lost
    the files it voted with (a wiped disk), and the next recovery would count an empty replica as a voter."""
    if not view.is_voting_member(node):
        return None
    pid = view.partition_id
    return Refusal(
        f"{node} is a voting member of partition {pid}'s store session {view.session_id} in ZooKeeper but does not "
        "hold the partition (its disk was lost?): an empty replica must not vote",
        f"replace it: waltz storage replace -s {node} -p {pid} (it leaves the votes until it holds a full copy)",
        "the next recovery counts the empty replica's vote; with one healthy replica down it can cut acknowledged "
        "transactions",
    )


def unassign(view: PartitionView, node: str) -> Refusal | None:
    """Unassigning must leave a majority of the previous replica set assigned, or no recovery can decide."""
    if node not in view.assigned:
        return None
    remaining = view.assigned - {node}
    if not remaining:
        return Refusal(
            f"partition {view.partition_id} would have no replica left without {node}",
            "assign another replica and recover it first",
        )
    if node not in view.states:
        return None
    kept = sorted(remaining & view.states.keys())
    if len(kept) >= view.quorum:
        return None
    members = ", ".join(sorted(view.states))
    return Refusal(
        f"partition {view.partition_id} would keep {len(kept)} of its previous replica set {{{members}}} "
        f"without {node}, fewer than the majority of {view.quorum} its next store session needs",
        "assign and recover a new replica and let a store session include it before unassigning this one",
        f"partition {view.partition_id} cannot resolve its high-water mark and takes no appends until enough "
        "of the previous replicas are assigned again; transactions acknowledged only by them are lost if their "
        "files go",
    )


def delete_listed(view: PartitionView, node: str) -> Refusal | None:
    """Deleting a replica's files is refused while ZooKeeper assigns it or lists it as a voting member."""
    pid = view.partition_id
    if node in view.assigned:
        return Refusal(
            f"ZooKeeper still assigns partition {pid} to {node}",
            f"unassign it first (waltz storage unassign -s {node} -p {pid})",
            "a replica a store session counts on loses its files",
        )
    if view.is_voting_member(node):
        return Refusal(
            f"{node} is still a member of partition {pid}'s store session {view.session_id} in ZooKeeper",
            "wait until the partition's next store session is running without it",
            "the next recovery may need this replica's vote",
        )
    return None


def delete_unique(view: PartitionView, node: str, local_max: int, others: Mapping[str, int | None]) -> Refusal | None:
    """Deleting a replica's files is refused when it holds transactions no other assigned replica holds.
    local_max: its max transaction id; others: each other assigned replica's, None when it could not be read."""
    if local_max < 0:
        return None
    known = [m for m in others.values() if m is not None]
    best = max(known, default=-1)
    if best >= local_max:
        return None
    pid = view.partition_id
    unknown = sorted(n for n, m in others.items() if m is None)
    where = f" (could not read {', '.join(unknown)})" if unknown else ""
    return Refusal(
        f"{node} holds partition {pid} up to transaction {local_max} but the other assigned replicas "
        f"{f'only up to {best}' if best >= 0 else 'hold nothing'}{where}",
        f"recover a replica from it first (waltz storage recover-partition -s {node} ...) or bring the others up",
        f"transactions {best + 1}..{local_max} of partition {pid} are gone if nothing else holds them",
    )


def reset_fence(partition_id: int, fence: int, target: int, current_session: int) -> Refusal | None:
    """`waltz storage reset-fence`: the fence goes back to target, normally ZooKeeper's current session of the
    partition. Refused when there is nothing to clear (the fence is not above target), and when target is
    above the current session (the fence would still lock the partition's next sessions out)."""
    if target < -1:
        return Refusal(f"partition {partition_id}: session {target} is not a session id", "give one >= -1")
    if fence <= target:
        return Refusal(
            f"partition {partition_id}: the node's fence is at session {fence}, not above {target}",
            "nothing to clear",
        )
    if target > current_session:
        return Refusal(
            f"partition {partition_id}: session {target} is above ZooKeeper's current session {current_session}",
            "reset the fence to the current session (leave out --session)",
        )
    return None
