"""Partition-to-server assignment: balanced, sticky, and a new generation for every partition that moves."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass


@dataclass(frozen=True, slots=True, order=True)
class PartitionInfo:
    """A partition as assigned to a server; its generation fences the previous owner's requests."""

    partition_id: int
    generation: int


def assign_partitions(
    live_servers: Iterable[int],
    current: Mapping[int, Iterable[PartitionInfo]],
    num_partitions: int,
    preferred: Mapping[int, Iterable[int]] | None = None,
) -> dict[int, list[PartitionInfo]]:
    """The original's DynamicPartitionAssignmentPolicy, deterministic (no shuffle).

    live_servers: ids of the servers to assign to. current: the stored assignment (server id -> its
    partitions), which may name dead servers. preferred: partition ids each server asks for, in its order.
    Returns every live server's partitions, sorted by id: each of the num_partitions partitions goes to
    exactly one live server, and each server gets floor(P/S) or floor(P/S) + 1 of them. Servers, in id
    order, first take their preferred partitions, then keep the ones they hold, then the rest are dealt
    out in partition id order. A partition keeps its generation only if it stays with its server; one that
    moves, or had no owner, gets generation + 1 (a partition never assigned before gets generation 1).
    """
    servers = sorted(set(live_servers))
    if not servers:
        return {}
    owner: dict[int, int | None] = {}
    generation: dict[int, int] = {}
    for server, infos in current.items():
        for info in infos:
            pid = info.partition_id
            if not 0 <= pid < num_partitions:
                raise ValueError(f"partition {pid} is outside 0..{num_partitions - 1}: cannot decrease partitions")
            # Held by two servers: trust neither, so the partition moves and gets a newer generation.
            owner[pid] = server if pid not in owner else None
            generation[pid] = max(info.generation, generation.get(pid, info.generation))

    base, remainder = divmod(num_partitions, len(servers))
    assignment: dict[int, list[PartitionInfo]] = {s: [] for s in servers}
    unassigned = set(range(num_partitions))
    extra = remainder  # how many more servers may take base + 1

    def take(server: int, pid: int) -> bool:
        nonlocal extra
        held = len(assignment[server])
        if pid not in unassigned or held > base or (held == base and extra == 0):
            return False
        if held == base:
            extra -= 1
        bump = 0 if owner.get(pid) == server else 1
        assignment[server].append(PartitionInfo(pid, generation.get(pid, 0) + bump))
        unassigned.discard(pid)
        return True

    for server in servers:
        for pid in dict.fromkeys((preferred or {}).get(server, ())):
            take(server, pid)
    for server in servers:
        for pid in sorted(p for p, s in owner.items() if s == server):
            take(server, pid)
    for server in servers:
        for pid in sorted(unassigned):
            if not take(server, pid):
                break
    return {s: sorted(infos) for s, infos in assignment.items()}
