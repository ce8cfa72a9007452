"""The next step of moving a partition's replica between storage nodes, from what ZooKeeper, the node and the
partition's owner say now (pure: no ZooKeeper, no gRPC).

Three ways a replica set changes, each keeping every acknowledged transaction on a majority of the replicas the
next store session's recovery asks:
- **replace** a node whose disk was lost: it leaves the partition's store session first (unassigned, so the next
  session runs without it and no longer counts it as a voter), then comes back as a new replica, which does not
  vote until it holds a full copy (it joins the write set by the server's catch-up, and votes from the session
  after that);
- **add** a replica on a node: created, assigned, caught up into the write set;
- **move** a replica from one node to another (drain, retire, rebalance onto new nodes): the new replica joins the
  write set before the old one is unassigned, and the move ends once a store session runs without the old one.

Each function looks at one partition and returns the one step to take now; the shell (waltz_cli.lifecycle) takes
it, waits for ZooKeeper and the owner to show its effect, and asks again until DONE.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from waltz_cli import guards
from waltz_cli.guards import PartitionView, Refusal


class Step(enum.Enum):
    UNASSIGN = "unassign"
    """Remove the replica from ZooKeeper's assignment (the owner starts a store session without it)."""
    AWAIT_SESSION_WITHOUT = "await a store session without it"
    """ZooKeeper still lists the replica as a voting member: the owner has not started the new session yet."""
    CREATE = "create"
    """Create the partition's (empty) files on the node."""
    ASSIGN = "assign"
    """Assign the replica in ZooKeeper (the owner starts a session with it as a new, non-voting replica)."""
    AWAIT_WRITE_SET = "await the write set"
    """The owner is catching the replica up; it takes appends once it is in the write set."""
    DONE = "done"


@dataclass(frozen=True)
class ReplicaFacts:
    """What one node has of one partition, and what the partition's owner says of it."""

    holds: bool
    """The node has the partition's files."""
    in_write_set: bool
    """The owner's current store session counts the node in its write set."""
    max_transaction_id: int = -1
    """The highest transaction the node holds of the partition (-1: none, or no files)."""


def replace_step(view: PartitionView, node: str, facts: ReplicaFacts) -> Step | Refusal:
    """The next step of replacing node's replica of the partition after its disk was lost."""
    if facts.holds and facts.in_write_set and node in view.assigned:
        return Step.DONE
    if not facts.holds and view.is_voting_member(node):
        if node in view.assigned:
            return guards.unassign(view, node) or Step.UNASSIGN
        return Step.AWAIT_SESSION_WITHOUT
    if not facts.holds:
        return Step.CREATE
    if node not in view.assigned:
        return Step.ASSIGN
    return Step.AWAIT_WRITE_SET


def add_step(view: PartitionView, node: str, facts: ReplicaFacts) -> Step | Refusal:
    """The next step of adding a replica of the partition on node."""
    if not facts.holds:
        return guards.create_on_voter(view, node) or Step.CREATE
    if node not in view.assigned:
        if facts.max_transaction_id >= 0 and node not in view.states:
            return Refusal(
                f"{node} holds an old copy of partition {view.partition_id} (up to transaction "
                f"{facts.max_transaction_id}) that ZooKeeper neither assigns nor lists: a new replica is built "
                "from nothing, copied from the write set",
                f"delete it first (waltz storage remove-partition -s {node} -p {view.partition_id} -d), then run "
                "this again",
            )
        return Step.ASSIGN
    return Step.DONE if facts.in_write_set else Step.AWAIT_WRITE_SET


def move_step(view: PartitionView, source: str, target: str, target_facts: ReplicaFacts) -> tuple[str, Step] | Refusal:
    """The next step of moving the partition's replica from source to target: (the node it concerns, the step)."""
    if source == target:
        return Refusal(f"partition {view.partition_id}: the source and the target are the same node", "name another")
    if source in view.assigned:
        added = add_step(view, target, target_facts)
        if isinstance(added, Refusal):
            return added
        if added is not Step.DONE:
            return target, added
        refusal = guards.unassign(view, source)
        return refusal if refusal is not None else (source, Step.UNASSIGN)
    if view.is_voting_member(source):
        return source, Step.AWAIT_SESSION_WITHOUT
    return source, Step.DONE


def pick_target(partition_id: int, source: str, candidates: dict[str, tuple[int, int]], assigned: frozenset[str],
                load: dict[str, int], source_group: int | None) -> str | Refusal:
    """Where a replica of the partition goes when it leaves source: a candidate (node -> (group, admin port)) that
    does not hold the partition yet, in source's replica group when one is, then the one holding fewest replicas."""
    free = sorted(node for node in candidates if node != source and node not in assigned)
    if not free:
        return Refusal(
            f"partition {partition_id}: every candidate node already holds a replica of it",
            "add a storage node (waltz storage add-node) or name another with --to",
        )
    return min(free, key=lambda node: (candidates[node][0] != source_group, load.get(node, 0), node))
