"""The failure detector's shell: probes every peer server's client port with grpc.health.v1 Check.

A probe asks for the peer's identity name (health.identity_name: its server id), so the answer says whether
the process answering at the address is that registration's: NOT_FOUND means another process (a restarted
server under a new id, or anything else) holds the address now.

The addresses are the ones in the peers' ZooKeeper descriptors (what clients are told). A probe goes out to
each peer every server.peerProbeInterval, each with server.peerTimeout as its deadline, so a slow answer
still counts; outcomes go to a PeerLiveness (liveness.py), which decides. The channel to a peer reconnects
within half a second at most, so a killed peer's refusals show at every probe.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable, Mapping

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from waltz_common import tls
from waltz_server.health import identity_name
from waltz_server.liveness import LivenessSettings, PeerLiveness, Probe

log = logging.getLogger(__name__)

CHANNEL_OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 500),
    ("grpc.enable_retries", 0),  # an UNAVAILABLE must come back as it is, not be retried away
]


def outcome(error: grpc.aio.AioRpcError | None, serving: bool = True) -> Probe:
    """A probe's outcome from its error (None: answered, SERVING or not)."""
    if error is None:
        return Probe.ANSWERED if serving else Probe.LEAVING
    code = error.code()
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return Probe.UNANSWERED
    if code == grpc.StatusCode.UNAVAILABLE:
        return Probe.REFUSED
    if code == grpc.StatusCode.NOT_FOUND:
        return Probe.OTHER  # a health service without this server id's name: another process holds the address
    return Probe.ANSWERED  # the peer's gRPC server said something: its process runs


class PeerWatch:
    """Probes the peers it is given and keeps the PeerLiveness view of them; on_change is called (on the loop)
    when the view's dead set changed."""

    def __init__(self, settings: LivenessSettings, tls_files: tls.TlsFiles | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.settings = settings
        self._tls = tls_files
        self._clock = clock
        self.view: PeerLiveness | None = None
        self._addresses: dict[int, str] = {}
        self._channels: dict[int, tuple[str, grpc.aio.Channel]] = {}
        self._in_flight: dict[int, int] = {}
        self._probes: set[asyncio.Task[None]] = set()
        self._task: asyncio.Task[None] | None = None
        self._on_change: Callable[[], None] = lambda: None
        self.deaths = 0  # peers declared dead (metrics)

    def start(self, me: int, on_change: Callable[[], None]) -> None:
        self.view = PeerLiveness(me, self.settings)
        self._on_change = on_change
        self._task = asyncio.get_running_loop().create_task(self._run(), name=f"peer-watch-{me}")

    def set_peers(self, addresses: Mapping[int, str]) -> None:
        """The registered servers (id -> host:port of their client port); this server's own entry is ignored."""
        if self.view is None:
            return
        previous = self._addresses
        self.view.watch(addresses, self._clock())
        self._addresses = {sid: a for sid, a in addresses.items() if sid != self.view.me}
        for sid in self.view.watched() - set(self._addresses):  # departed within the grace: still probed
            if sid in previous:
                self._addresses[sid] = previous[sid]
        for sid in list(self._channels):
            address, channel = self._channels[sid]
            if self._addresses.get(sid) != address:
                del self._channels[sid]
                self._close_later(channel)

    def alive(self, registered: Iterable[int]) -> list[int]:
        registered = list(registered)
        return self.view.alive(registered) if self.view is not None else sorted(registered)

    def dead(self) -> frozenset[int]:
        return self.view.dead() if self.view is not None else frozenset()

    async def stop(self) -> None:
        tasks = [t for t in (self._task, *self._probes) if t is not None]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for _, channel in self._channels.values():
            await channel.close()
        self._channels.clear()

    def _channel(self, sid: int, address: str) -> grpc.aio.Channel:
        found = self._channels.get(sid)
        if found is None:
            found = (address, tls.aio_channel(address, self._tls, CHANNEL_OPTIONS))
            self._channels[sid] = found
        return found[1]

    def _close_later(self, channel: grpc.aio.Channel) -> None:
        task = asyncio.get_running_loop().create_task(channel.close())
        self._probes.add(task)
        task.add_done_callback(self._probes.discard)

    async def _run(self) -> None:
        assert self.view is not None
        view, interval = self.view, self.settings.probe_interval_s
        most = max(1, int(self.settings.timeout_s / interval) + 1)  # probes per peer in flight at most
        while True:
            for sid, address in self._addresses.items():
                if self._in_flight.get(sid, 0) < most:
                    self._probe(sid, address)
            before = view.dead()
            if view.tick(self._clock()):
                watched = view.watched()
                self._addresses = {sid: a for sid, a in self._addresses.items() if sid in watched}
                after = view.dead()
                if after - before:
                    self.deaths += len(after - before)
                    log.warning("peer servers %s are dead (no answer, or refused); alive again: %s",
                                sorted(after - before), sorted(before - after) or "none")
                elif before - after:
                    log.info("peer servers %s answer again", sorted(before - after))
                self._on_change()
            await asyncio.sleep(interval)

    def _probe(self, sid: int, address: str) -> None:
        self._in_flight[sid] = self._in_flight.get(sid, 0) + 1
        task = asyncio.get_running_loop().create_task(self._check(sid, address))
        self._probes.add(task)
        task.add_done_callback(self._probes.discard)

    async def _check(self, sid: int, address: str) -> None:
        error: grpc.aio.AioRpcError | None = None
        serving = True
        try:
            stub = health_pb2_grpc.HealthStub(self._channel(sid, address))
            answer = await stub.Check(
                health_pb2.HealthCheckRequest(service=identity_name(sid)), timeout=self.settings.timeout_s
            )
            serving = answer.status == health_pb2.HealthCheckResponse.SERVING
        except grpc.aio.AioRpcError as exc:
            error = exc
        except Exception as exc:  # the channel was closed under the probe (the peer's address changed): no news
            log.debug("probe of server %d at %s: %r", sid, address, exc)
            return
        finally:
            self._in_flight[sid] -= 1
        if self.view is not None and self._channels.get(sid, (None,))[0] == address:
            self.view.observe(sid, outcome(error, serving), self._clock())
