"""Which peer servers are dead, decided from health probes without waiting for ZooKeeper's session expiry.

Every server probes the client port of every other registered server (peers.py, the gRPC shell) and feeds
the outcomes to a PeerLiveness, the pure decision here. A peer is dead when

- its connections are refused or reset: every probe failed that way for `refused_confirm_s` (and at
  least twice) since it last answered: a killed process, whose kernel resets its connections at once;
- it answered nothing for `timeout_s`: a frozen process (SIGSTOP, a hung machine, a cut network);
- another process answers at its address (Probe.OTHER) after the peer itself had answered: a peer is an
  incarnation, not an address. A probe asks for the registration's own server id (ids are never reused: a
  restarted process takes a new one), so a new process on a dead server's address makes that registration dead
  at once, and can never make it look alive.

Anything else a peer answers, even an error, shows its process runs. A peer never heard from as itself is not
judged (a firewall or a TLS mistake must not make every server look dead, nor a peer of an older release, which
does not answer for its id; ZooKeeper's session expiry still covers it, and a server that starts on a dead
registration's address deletes that registration: cluster.stale_registrations). A dead peer is alive again
once it answered for `rejoin_s` without a failure in between.

This server's own pauses must not make its peers look dead: a tick that comes more than half the timeout
after the one before means this process was stopped or starved meanwhile, so every peer's clocks start
again at that tick (their silence during our pause proves nothing). `rejoin_s` after such a stall the
view is reported changed once, so that a coordinator that was paused looks at the assignment again
(its peers may have moved partitions meanwhile).

The coordinator is the smallest server id among the registered servers this server does not hold dead,
itself included: when the coordinator is the dead one, the next one takes its place at once.

A registration that vanishes while its server answers as itself, SERVING, is a session that expired (a
frozen ZooKeeper expires sessions as it wakes), not a departure: for `timeout_s` that server still counts
as live (its partitions stay where they are) while it registers again. A server that stops gracefully
answers NOT_SERVING (Probe.LEAVING) first, so its partitions move as soon as a probe hears it.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass, field


class Probe(enum.Enum):
    ANSWERED = "answered"  # any answer (an error status too): the process runs
    REFUSED = "refused"  # connection refused or reset (gRPC UNAVAILABLE)
    UNANSWERED = "unanswered"  # the probe's deadline passed
    OTHER = "other"  # a process answered at the address, but not as this server id: the registration's is gone
    LEAVING = "leaving"  # answered as itself, NOT_SERVING: the process is shutting down


@dataclass(frozen=True, slots=True)
class LivenessSettings:
    """The failure detector's timing (server.peer* keys)."""

    enabled: bool = True
    probe_interval_s: float = 0.25
    refused_confirm_s: float = 0.5
    timeout_s: float = 3.0
    rejoin_s: float = 2.0

    def __post_init__(self) -> None:
        if min(self.probe_interval_s, self.refused_confirm_s, self.timeout_s, self.rejoin_s) <= 0:
            raise ValueError("the server.peer* intervals and timeouts must be positive")
        if self.refused_confirm_s >= self.timeout_s:
            raise ValueError("server.peerRefusedConfirm must be shorter than server.peerTimeout")
        if self.probe_interval_s * 2 > self.refused_confirm_s:
            raise ValueError("server.peerProbeInterval must be at most half of server.peerRefusedConfirm")

    @property
    def stall_s(self) -> float:
        """A gap between two ticks longer than this is a pause of this process."""
        return self.timeout_s / 2


@dataclass(slots=True)
class _Peer:
    since: float  # when the current silence began: the last answer, or when watching (re)started
    answered_once: bool = False
    refused_since: float | None = None  # first refusal since the last answer
    refusals: int = 0
    dead: bool = False
    replaced: bool = False  # another process answered at its address: dead for good (ids are never reused)
    answering_since: float | None = None  # while dead: the first answer of the current run of answers
    serving: bool = False  # its last answer was as itself and SERVING
    departed_at: float | None = None  # when its registration vanished while it was serving


@dataclass(slots=True)
class PeerLiveness:
    """The dead peers as seen from server `me`; all times are monotonic seconds passed in by the caller."""

    me: int
    settings: LivenessSettings = field(default_factory=LivenessSettings)
    _peers: dict[int, _Peer] = field(default_factory=dict)
    _last_tick: float | None = None
    _resync_at: float | None = None
    stalls: int = 0

    def watch(self, registered: Iterable[int], now: float) -> None:
        """The servers registered in ZooKeeper now: new ones are watched from now, gone ones forgotten (those
        still serving as themselves after `timeout_s` only: their sessions expired, they register again)."""
        ids = {sid for sid in registered if sid != self.me}
        for sid, state in list(self._peers.items()):
            if sid in ids:
                state.departed_at = None
            elif state.departed_at is None and state.serving and not state.dead:
                state.departed_at = now
            elif state.departed_at is None:
                del self._peers[sid]
        for sid in ids:
            self._peers.setdefault(sid, _Peer(since=now))

    def watched(self) -> frozenset[int]:
        """The peers watched now: the registered ones and those departed within the grace."""
        return frozenset(self._peers)

    def observe(self, peer: int, probe: Probe, now: float) -> None:
        """A probe of peer ended (now: when its outcome arrived)."""
        state = self._peers.get(peer)
        if state is None:
            return
        state.serving = probe is Probe.ANSWERED and not state.replaced
        if probe is Probe.OTHER:
            state.replaced = state.answered_once  # never heard from as itself: not judged (an older release)
            state.answering_since = None
            return
        if probe in (Probe.ANSWERED, Probe.LEAVING):
            if state.replaced:
                return  # an answer as this id after another process answered: impossible, and never a rejoin
            state.since = max(state.since, now)
            state.answered_once = True
            state.refused_since, state.refusals = None, 0
            if state.dead and state.answering_since is None:
                state.answering_since = now
            return
        state.answering_since = None
        if probe is Probe.REFUSED:
            if state.refused_since is None:
                state.refused_since = now
            state.refusals += 1

    def tick(self, now: float) -> bool:
        """Decide; call it every probe interval. True when the dead set changed (or a stall's resync is due)."""
        changed = False
        if self._last_tick is not None and now - self._last_tick > self.settings.stall_s:
            self._stalled(now)
        self._last_tick = now
        if self._resync_at is not None and now >= self._resync_at:
            self._resync_at = None
            changed = True
        for sid, state in list(self._peers.items()):
            if state.departed_at is not None and (
                state.dead or not state.serving or now - state.departed_at >= self.settings.timeout_s
            ):
                del self._peers[sid]  # left for good (or never came back): the coordinator assigns without it
                changed = True
                continue
            if state.dead:
                if state.answering_since is not None and now - state.answering_since >= self.settings.rejoin_s:
                    state.dead, state.answering_since = False, None
                    state.since = now
                    changed = True
            elif self._is_dead(state, now):
                state.dead = True
                changed = True
        return changed

    def _is_dead(self, state: _Peer, now: float) -> bool:
        if state.replaced:
            return True
        if not state.answered_once:
            return False
        s = self.settings
        refused = (
            state.refused_since is not None and state.refusals >= 2 and now - state.refused_since >= s.refused_confirm_s
        )
        return refused or now - state.since >= s.timeout_s

    def _stalled(self, now: float) -> None:
        self.stalls += 1
        for state in self._peers.values():
            state.since = now
            state.refused_since, state.refusals = None, 0
            state.answering_since = None if not state.dead else state.answering_since
        self._resync_at = now + self.settings.rejoin_s

    def dead(self) -> frozenset[int]:
        return frozenset(sid for sid, state in self._peers.items() if state.dead)

    def alive(self, registered: Iterable[int]) -> list[int]:
        """The registered servers this server does not hold dead (itself always counts), and those whose
        registration vanished within `timeout_s` while they still serve as themselves, sorted."""
        dead = self.dead()
        departed = {sid for sid, state in self._peers.items() if state.departed_at is not None}
        return sorted(sid for sid in set(registered) | departed if sid == self.me or sid not in dead)

    def coordinator(self, registered: Iterable[int]) -> int | None:
        """The server that assigns partitions in this view: the smallest live id."""
        alive = self.alive(registered)
        return alive[0] if alive else None
