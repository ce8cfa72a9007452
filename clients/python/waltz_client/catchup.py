"""What a partition knows of its catch-up while it mounts, and what a mount is waiting for (pure: no I/O, no clock).

A mount completes (the server's READY) only after the feed from the client's high-water mark up to the
partition's has been applied: a client far behind is MOUNTING for as long as that takes. CatchUp turns what the
partition has seen into a line for people (the INFO progress log, the mount timeout's message) and a number for
the metrics.
"""

from __future__ import annotations

from dataclasses import dataclass

from waltz_client.partition_state import MountState


@dataclass(slots=True)
class CatchUp:
    """One mount's catch-up: from the client's high-water mark when the mount was sent (at started_at, the loop's
    clock) towards target, the partition's high-water mark as last heard (None: not heard yet)."""

    started_at: float
    start_high_water_mark: int
    endpoint: str
    target: int | None = None

    def applied(self, client_high_water_mark: int) -> int:
        """Transactions applied since the mount was sent."""
        return max(0, client_high_water_mark - self.start_high_water_mark)

    def remaining(self, client_high_water_mark: int) -> int:
        """Transactions still to apply up to the target (0 when it is not known)."""
        return 0 if self.target is None else max(0, self.target - client_high_water_mark)

    def rate(self, now: float, client_high_water_mark: int) -> float:
        """Transactions applied per second since the mount was sent."""
        elapsed = now - self.started_at
        return self.applied(client_high_water_mark) / elapsed if elapsed > 0 else 0.0

    def seconds_left(self, now: float, client_high_water_mark: int) -> float | None:
        """At the rate so far; None before anything was applied or with no target."""
        rate = self.rate(now, client_high_water_mark)
        if self.target is None or rate <= 0:
            return None
        return self.remaining(client_high_water_mark) / rate

    def catching_up(self, client_high_water_mark: int) -> bool:
        """Something was applied under this mount, or is known to be still to apply."""
        return self.applied(client_high_water_mark) > 0 or self.remaining(client_high_water_mark) > 0

    def describe(self, now: float, client_high_water_mark: int) -> str:
        """`applied 12,000 of 56,000 at 340/s, about 2 min 9 s left`."""
        applied = self.applied(client_high_water_mark)
        if self.target is None:
            of = " (the partition's high-water mark not heard yet)"
        else:
            of = f" of {max(applied, self.target - self.start_high_water_mark):,}"
        text = f"applied {applied:,}{of} at {self.rate(now, client_high_water_mark):,.0f}/s"
        left = self.seconds_left(now, client_high_water_mark)
        if left is not None:
            text += f", about {duration(left)} left"
        return text


def duration(seconds: float) -> str:
    """`0.5 s`, `45 s`, `2 min 9 s`, `3 h 5 min`."""
    if seconds < 9.95:
        return f"{max(0.0, seconds):.1f} s"
    whole = round(seconds)
    if whole < 60:
        return f"{whole} s"
    if whole < 3600:
        return f"{whole // 60} min {whole % 60} s"
    return f"{whole // 3600} h {whole % 3600 // 60} min"


def mount_wait_reason(mount_state: MountState, owner: str | None, catchup: CatchUp | None,
                      client_high_water_mark: int, now: float, problem: str | None) -> str:
    """What a partition not mounted yet is waiting for, for the mount timeout's message.

    owner: the endpoint of the partition's server (None: no server owns it); catchup: the current mount's (None:
    no mount sent); problem: what ended the previous attempt, if anything did (cannot connect, NOT_READY, ...)."""
    if owner is None:
        return "no server owns the partition (is a server up? are the partitions assigned?)"
    if mount_state is MountState.MOUNTING and catchup is not None:
        if catchup.catching_up(client_high_water_mark):
            return (f"still catching up from {catchup.endpoint}: {catchup.describe(now, client_high_water_mark)} "
                    "(a mount completes only once the feed up to the partition's high-water mark is applied)")
        waited = (f"no answer from server {catchup.endpoint} to the mount request for "
                  f"{duration(now - catchup.started_at)}")
        return f"{waited} (before it: {problem})" if problem else waited
    if problem:
        return problem
    return f"mount state: {mount_state.value}, server {owner}"
