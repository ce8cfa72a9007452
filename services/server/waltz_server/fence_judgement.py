"""What a store session makes of a replica's fence refusal and of a damage poll's answer (issue 33); pure.

A replica refuses a session whose id is below its fence. Every session id is taken in ZooKeeper by compare-and-set
before any request carries it, so when ZooKeeper still holds this session as the partition's newest, the replica's
fence was raised by something else (a forged or mistaken request): a poisoned fence. Such a replica is left out and
flagged, and the session goes on with the others if they are a majority. When ZooKeeper holds a newer session, or
cannot say, the refusal stands: the session is fenced. The store session (store/store_session.py) asks ZooKeeper
and the replicas and carries out what FenceJudgement and damage_restart decide.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

DAMAGE_SHOWN = 5
"""Damaged transaction ids named in a damage poll's restart reason (then "...")."""


@dataclass(frozen=True, slots=True)
class Fenced:
    """The refusal stands: a newer session exists, or ZooKeeper cannot tell a poisoned fence from one."""


@dataclass(frozen=True, slots=True)
class LeftOut:
    """The replica's fence is poisoned: it is left out of this session (retried until an operator resets it)."""

    detail: str
    """For the replica's status line: why it is left out and how to clear it."""
    first: bool
    """First time this session leaves it out (log it once, not at every retry)."""
    ends_session: str | None
    """It is in the write set: the session ends for this reason, and the next one leaves the replica out."""


FenceVerdict = Fenced | LeftOut


class FenceJudgement:
    """One store session's judgement of its replicas' fence refusals; remembers the replicas it left out."""

    def __init__(self, session_id: int, can_ask_zookeeper: bool) -> None:
        self.session_id = session_id
        self.can_ask_zookeeper = can_ask_zookeeper
        self.poisoned: set[str] = set()
        """Replicas left out: their fence is above this session, which is the newest."""

    def asks_zookeeper(self, refused_by_replica: bool) -> bool:
        """Whether ZooKeeper must be asked about this failure: a replica refused the session for its fence (any
        other failure, or a session with no way to ask, is not judged here and ends or retries as it is)."""
        return refused_by_replica and self.can_ask_zookeeper

    def judge(self, replica: str, refusal: str, newest: bool | None, in_write_set: bool) -> FenceVerdict:
        """replica refused this session with refusal; newest is what ZooKeeper says (whether this session is still
        the partition's newest), None when it could not be read."""
        if not newest:
            return Fenced()
        detail = (
            f"left out: its fence is above session {self.session_id}, the partition's newest "
            f"({refusal}); clear it with `waltz storage reset-fence`"
        )
        first = replica not in self.poisoned
        self.poisoned.add(replica)
        ends = f"replica {replica}: {refusal}; the next session leaves it out" if in_write_set else None
        return LeftOut(detail, first, ends)


def damage_restart(replica: str, damaged: Sequence[int]) -> str | None:
    """The reason to end the session when a member reports damaged transactions (the next session's recovery
    repairs them from an intact replica before it takes appends); None when it reports none."""
    if not damaged:
        return None
    shown = ", ".join(map(str, damaged[:DAMAGE_SHOWN])) + (", ..." if len(damaged) > DAMAGE_SHOWN else "")
    return f"replica {replica} holds {len(damaged)} damaged transactions ({shown})"
