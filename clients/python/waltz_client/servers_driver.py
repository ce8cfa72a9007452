"""Discovery from server addresses alone (client.servers): no ZooKeeper on the client side.

Any server answers GetClusterInfo (partitions, owners, generations, limits) and GetClientId. The driver asks the
configured addresses, then also the owners it learned, in turn until one answers; it polls GetClusterInfo every
client.discoveryIntervalSeconds and at once when a partition heard NOT_READY or lost its stream (refresh()), and
reports each change of ownership as the ZooKeeper driver does.

Each failed attempt to reach a server is a WARNING line (address, call, gRPC status, the next try); when none answers
within client.requestTimeout the call ends with UnavailableError naming each server's last failure.

A poll asks every server it knows at once and merges what answers within a moment of the first answer, each
partition taking the owner with the highest generation: a frozen server (the owner that just failed) cannot
hold the lookup up, and a server whose view is behind cannot take a newer owner back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import grpc

from waltz.v1 import server_pb2, server_pb2_grpc
from waltz_client.config import ClientConfig
from waltz_client.driver import ClusterInfo, Ownership, Topology
from waltz_client.errors import UnavailableError
from waltz_client.grpc_driver import GrpcDriver

log = logging.getLogger(__name__)

R = TypeVar("R")
RETRY_S = 0.5
"""The first wait before asking the servers again after none answered; it doubles up to MAX_RETRY_S."""
MAX_RETRY_S = 5.0
MERGE_WINDOW_S = 0.1
"""How long a poll waits for more answers after the first one."""
EAGER_S = 5.0
EAGER_INTERVAL_S = 0.1
"""After refresh(), poll every EAGER_INTERVAL_S until the ownership changes, for at most EAGER_S: the servers move
a dead owner's partitions about a second after it died, later than its clients notice."""


def topology_of(info: server_pb2.ClusterInfoResponse) -> dict[int, Ownership]:
    """partition id -> Ownership from a GetClusterInfo answer (no address: unowned)."""
    return {p.partition_id: Ownership(p.address or None, p.generation) for p in info.partitions}


def freshest(current: Topology, answers: Sequence[Topology]) -> dict[int, Ownership]:
    """Per partition, the ownership with the highest generation among the answers; the current one stays when
    every answer is older, or has no owner for it (a generation only grows when a partition moves)."""
    merged: dict[int, Ownership] = {}
    for pid in sorted({p for a in answers for p in a} | set(current)):
        seen = [a[pid] for a in answers if pid in a and a[pid].endpoint is not None]
        best = max(seen, key=lambda o: o.generation, default=None)
        now = current.get(pid)
        if best is None or (now is not None and now.endpoint is not None and now.generation > best.generation):
            best = now if now is not None else next((a[pid] for a in answers if pid in a), None)
        if best is not None:
            merged[pid] = best
    return merged


def addresses_to_try(seeds: Sequence[str], topology: Topology, last_good: str | None) -> list[str]:
    """The server that answered last first, then the configured ones, then owners learned since (no repeats)."""
    ordered = [last_good] if last_good else []
    ordered += list(seeds)
    ordered += sorted({o.endpoint for o in topology.values() if o.endpoint})
    return list(dict.fromkeys(ordered))


class ServersDriver(GrpcDriver):
    """GrpcDriver's streams and unary calls, with the cluster learnt from the servers instead of ZooKeeper."""

    def __init__(self, config: ClientConfig) -> None:
        super().__init__(config)
        if not config.servers:
            raise ValueError("ServersDriver needs client.servers")
        self._seeds = config.servers
        self._topology: dict[int, Ownership] = {}
        self._last_good: str | None = None
        self._wake = asyncio.Event()
        self._eager_until = 0.0  # loop time until which polls come every EAGER_INTERVAL_S
        self._poller: asyncio.Task[None] | None = None
        self.limits = server_pb2.Limits()

    async def start(self, on_topology: Callable[[Topology], None]) -> ClusterInfo:
        deadline = asyncio.get_running_loop().time() + self.config.request_timeout_s
        info = await self._any("GetClusterInfo", lambda stub, t: stub.GetClusterInfo(
            server_pb2.ClusterInfoRequest(), timeout=t), deadline)
        ids = await self._any("GetClientId", lambda stub, t: stub.GetClientId(
            server_pb2.ClientIdRequest(), timeout=t), deadline)
        self.limits = info.limits
        self._topology = topology_of(info)
        on_topology(dict(self._topology))
        self._poller = asyncio.create_task(self._poll(on_topology), name="waltz-cluster-info")
        return ClusterInfo(ids.client_id, info.num_partitions, info.cluster_name)

    def refresh(self) -> None:
        self._eager_until = asyncio.get_running_loop().time() + EAGER_S
        self._wake.set()

    async def _poll(self, on_topology: Callable[[Topology], None]) -> None:
        loop = asyncio.get_running_loop()
        while True:
            eager = loop.time() < self._eager_until
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(EAGER_INTERVAL_S if eager else self.config.discovery_interval_s):
                    await self._wake.wait()
            self._wake.clear()
            answers = await self._ask_all()
            if not answers:
                log.warning("cluster info: no server answered")
                continue
            topology = freshest(self._topology, [topology_of(info) for info in answers])
            if topology != self._topology:
                self._eager_until = 0.0
                self._topology = topology
                on_topology(dict(topology))

    async def _ask_all(self) -> list[server_pb2.ClusterInfoResponse]:
        """GetClusterInfo of every server known, at once: the answers that came within MERGE_WINDOW_S of the first."""
        timeout = self.config.request_timeout_s
        addresses = addresses_to_try(self._seeds, self._topology, self._last_good)
        calls = {asyncio.ensure_future(server_pb2_grpc.WaltzServerStub(self._channel(a)).GetClusterInfo(
            server_pb2.ClusterInfoRequest(), timeout=timeout)): a for a in addresses}
        answers: list[server_pb2.ClusterInfoResponse] = []
        pending = set(calls)
        try:
            async with asyncio.timeout(timeout):
                while pending and not answers:
                    done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                    answers += self._answers(done, calls)
            if pending:
                done, pending = await asyncio.wait(pending, timeout=MERGE_WINDOW_S)
                answers += self._answers(done, calls)
        except TimeoutError:
            pass
        finally:
            for call in pending:
                call.cancel()
        return answers

    def _answers(self, done: set[asyncio.Future[Any]], calls: dict[asyncio.Future[Any], str]) -> list[
            server_pb2.ClusterInfoResponse]:
        found = []
        for call in done:
            if call.cancelled() or call.exception() is not None:
                continue
            self._last_good = calls[call]
            found.append(call.result())
        return found

    async def _any(self, name: str, call: Callable[[server_pb2_grpc.WaltzServerStub, float], Awaitable[R]],
                   deadline: float) -> R:
        """call on the servers in turn until one answers, until deadline; a WARNING per failed attempt, then
        UnavailableError naming each server's last failure."""
        loop = asyncio.get_running_loop()
        pause = RETRY_S
        while True:
            failures: list[str] = []
            for address in addresses_to_try(self._seeds, self._topology, self._last_good):
                timeout = min(5.0, max(0.1, deadline - loop.time()))
                try:
                    answer = await call(server_pb2_grpc.WaltzServerStub(self._channel(address)), timeout)
                except grpc.aio.AioRpcError as exc:
                    failure = f"{address}: {exc.code().name}: {exc.details()}"
                    failures.append(failure)
                    left = deadline - loop.time()
                    log.warning("Waltz server %s did not answer %s (%s); %s", address, name, failure.split(": ", 1)[1],
                                f"trying again for {left:.0f} s more" if left > 0 else "giving up")
                    continue
                self._last_good = address
                return answer
            if loop.time() >= deadline:
                raise UnavailableError(f"no Waltz server answered {name} within {self.config.request_timeout_s:g} s "
                                       "(client.requestTimeout): " + "; ".join(failures))
            await asyncio.sleep(min(pause, max(0.0, deadline - loop.time())))
            pause = min(pause * 2, MAX_RETRY_S)

    async def close(self) -> None:
        if self._poller is not None:
            self._poller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._poller
        await super().close()
