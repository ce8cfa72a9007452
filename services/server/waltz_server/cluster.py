"""ZooKeeper membership: server id, ephemeral registration, the coordinator's assignment, ownership.

The coordinator assigns partitions over the servers that are registered and, when a PeerWatch is given, not
found dead by it (peers.py): a killed or frozen owner's partitions move once the failure detector says so,
without waiting for ZooKeeper to expire its session; when the coordinator is the dead one, the next server in
id order takes its place. Safety does not rest on this view being right: a new owner's store session fences
the old owner's at the storage nodes (docs/failover.md).

kazoo runs on its own threads. Its watch and connection-state callbacks only post events to the
asyncio loop; one task there handles them in order, and blocking ZooKeeper calls go to a thread.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping

from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError
from kazoo.protocol.states import KazooState

from waltz.v1 import metadata_pb2
from waltz_common import zk as zkmeta
from waltz_common.zk import ZkPaths
from waltz_server.assignment import PartitionInfo, assign_partitions
from waltz_server.ownership import PartitionManager
from waltz_server.peers import PeerWatch

log = logging.getLogger(__name__)

UNOWNED = -1

REJOIN_GRACE_S = 3.0
"""After its own session expired, a server waits this long before it assigns partitions as coordinator: when
ZooKeeper expired every session at once (it was frozen), the others are registering again meanwhile, and an
assignment over the servers registered so far would move their partitions for nothing."""


def live_server_ids(children: Iterable[str]) -> list[int]:
    """Server ids from the children of <root>/servers (anything else there is ignored)."""
    return sorted(int(c) for c in children if c.isdigit())


def stale_registrations(
    server_id: int, host: str, port: int, descriptors: Mapping[int, metadata_pb2.ServerDescriptor]
) -> list[int]:
    """The other registrations that name this server's own address: their processes are gone (this one could
    bind the port, and a server's port is never shared), their sessions not expired yet. A peer is an
    incarnation, not an address: they must not stay registered, nor look alive through this process."""
    return sorted(
        sid for sid, d in descriptors.items() if sid != server_id and d.host == host and d.port == port
    )


def is_coordinator(server_id: int, live: Iterable[int]) -> bool:
    """The live server with the smallest id assigns partitions."""
    ids = list(live)
    return bool(ids) and min(ids) == server_id


def stored_assignment(message: metadata_pb2.ServerAssignment) -> dict[int, list[PartitionInfo]]:
    """server id (UNOWNED for none) -> its partitions, as assign_partitions takes them."""
    current: dict[int, list[PartitionInfo]] = {}
    for p in message.partitions:
        current.setdefault(p.server_id, []).append(PartitionInfo(p.partition_id, p.generation))
    return current


def assignment_message(assignment: Mapping[int, Iterable[PartitionInfo]]) -> metadata_pb2.ServerAssignment:
    entries = sorted(
        (info.partition_id, server, info.generation) for server, infos in assignment.items() for info in infos
    )
    return metadata_pb2.ServerAssignment(
        partitions=[metadata_pb2.PartitionOwnership(partition_id=p, server_id=s, generation=g) for p, s, g in entries]
    )


def next_assignment(
    message: metadata_pb2.ServerAssignment,
    live: list[int],
    num_partitions: int,
    preferred: Mapping[int, Iterable[int]] | None = None,
) -> metadata_pb2.ServerAssignment | None:
    """The assignment the coordinator should write, or None when the stored one stands."""
    if not live:
        return None
    proposed = assignment_message(assign_partitions(live, stored_assignment(message), num_partitions, preferred))
    return None if proposed == message else proposed


def owned_by(message: metadata_pb2.ServerAssignment, server_id: int) -> dict[int, int]:
    """partition id -> generation of the partitions assigned to server_id."""
    return {p.partition_id: p.generation for p in message.partitions if p.server_id == server_id}


class ClusterMembership:
    """This server's place in the cluster, kept in step with ZooKeeper; opens and closes partitions."""

    def __init__(
        self,
        zk: KazooClient,
        paths: ZkPaths,
        host: str,
        port: int,
        num_partitions: int,
        manager: PartitionManager,
        on_connected: Callable[[bool], Awaitable[None]] | None = None,
        on_identity: Callable[[int], Awaitable[None]] | None = None,
        preferred_partitions: Iterable[int] = (),
        retry_seconds: float = 1.0,
        peers: PeerWatch | None = None,
    ) -> None:
        """peers: the failure detector whose dead servers the coordinator leaves out (None: only ZooKeeper's
        registrations count). on_identity: called with the server id once taken, before it is registered (the
        health name peers probe must answer before they see the registration)."""
        self.zk = zk
        self.paths = paths
        self.host = host
        self.port = port
        self.num_partitions = num_partitions
        self.manager = manager
        self.server_id = -1
        self._on_connected = on_connected
        self._on_identity = on_identity
        self._preferred = list(preferred_partitions)
        self._retry_s = retry_seconds
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake = asyncio.Event()
        self._states: list[str] = []
        self._children: list[str] | None = None
        self._registered: list[int] | None = None  # the registered server ids last seen
        self._recheck = False  # the failure detector's view changed: assign again
        self._peers = peers
        self._descriptors_seen: dict[int, metadata_pb2.ServerDescriptor] = {}
        self._assignment: bytes | None = None
        self._lost = False
        self._assign_after = 0.0  # loop time before which this server does not assign (REJOIN_GRACE_S)
        self._grace: asyncio.TimerHandle | None = None
        self._stopping = False
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> int:
        """Take a server id, register, watch membership and assignment; returns the server id."""
        self._loop = asyncio.get_running_loop()
        self.server_id = await asyncio.to_thread(self._take_id)
        if self._on_identity is not None:
            await self._on_identity(self.server_id)
        await asyncio.to_thread(self._register)
        await asyncio.to_thread(self._remove_stale)
        self.zk.add_listener(self._on_state)
        if self._peers is not None:
            self._peers.start(self.server_id, lambda: self._post(lambda: setattr(self, "_recheck", True)))
        self._task = asyncio.create_task(self._run(), name=f"cluster-membership-{self.server_id}")
        await asyncio.to_thread(self._watch)
        log.info("server %d registered at %s", self.server_id, self.paths.server(self.server_id))
        return self.server_id

    async def stop(self) -> None:
        """Deregister (the coordinator then moves this server's partitions) and stop watching."""
        self._stopping = True
        self.zk.remove_listener(self._on_state)
        if self._peers is not None:
            await self._peers.stop()
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        try:
            await asyncio.to_thread(self.zk.delete, self.paths.server(self.server_id))
        except Exception as exc:  # gone already, or ZooKeeper unreachable: the session ends it anyway
            log.info("server %d: deregistering: %r", self.server_id, exc)

    # ZooKeeper calls (run in a worker thread)

    def _take_id(self) -> int:
        return zkmeta.increment(self.zk, self.paths.server_ids)

    def _register(self) -> None:
        descriptor = metadata_pb2.ServerDescriptor(
            server_id=self.server_id, host=self.host, port=self.port, preferred_partitions=self._preferred
        )
        try:
            zkmeta.create(self.zk, self.paths.server(self.server_id), descriptor, ephemeral=True)
        except NodeExistsError:
            pass  # registered by this session already

    def _remove_stale(self) -> None:
        """Delete the registrations of earlier processes on this server's address (see stale_registrations)."""
        registered = live_server_ids(self.zk.get_children(self.paths.servers))
        for sid in stale_registrations(self.server_id, self.host, self.port, self._descriptors(registered)):
            try:
                self.zk.delete(self.paths.server(sid))
            except NoNodeError:
                continue  # its session expired meanwhile
            log.warning("server %d: removed server %d's registration: it names this server's address %s:%d, "
                        "so its process is gone", self.server_id, sid, self.host, self.port)

    def _watch(self) -> None:
        self.zk.ChildrenWatch(self.paths.servers, self._on_children, allow_session_lost=True)
        self.zk.DataWatch(self.paths.server_assignment, self._on_assignment)

    def _reassign(self, live: list[int], descriptors: Mapping[int, metadata_pb2.ServerDescriptor]) -> None:
        """As coordinator of the live servers (registered, not found dead): write their assignment, compare-and-set."""
        if not is_coordinator(self.server_id, live):
            return
        preferred = {sid: list(d.preferred_partitions) for sid, d in descriptors.items() if sid in live}
        path = self.paths.server_assignment
        while True:
            found = zkmeta.read(self.zk, path, metadata_pb2.ServerAssignment)
            current, version = (found[0], found[1].version) if found else (metadata_pb2.ServerAssignment(), None)
            proposed = next_assignment(current, live, self.num_partitions, preferred)
            if proposed is None:
                return
            try:
                if version is None:
                    zkmeta.create(self.zk, path, proposed)
                else:
                    zkmeta.write(self.zk, path, proposed, version=version)
            except (BadVersionError, NodeExistsError):
                continue
            dead = sorted(set(stored_assignment(current)) - set(live) - {UNOWNED})
            log.info("coordinator %d assigned partitions over servers %s%s", self.server_id, live,
                     f" (moved off {dead})" if dead else "")
            return

    def _descriptors(self, live: list[int]) -> dict[int, metadata_pb2.ServerDescriptor]:
        found: dict[int, metadata_pb2.ServerDescriptor] = {}
        for sid in live:
            try:
                entry = zkmeta.read(self.zk, self.paths.server(sid), metadata_pb2.ServerDescriptor)
            except NoNodeError:
                entry = None
            if entry is not None:
                found[sid] = entry[0]
        return found

    # kazoo threads: only post to the loop

    def _on_state(self, state: str) -> None:
        self._post(lambda: self._states.append(state))

    def _on_children(self, children: list[str]) -> bool | None:
        if self._stopping:
            return False
        self._post(lambda: setattr(self, "_children", list(children)))
        return None

    def _on_assignment(self, data: bytes | None, stat: object) -> bool | None:
        if self._stopping:
            return False
        self._post(lambda: setattr(self, "_assignment", data or b""))
        return None

    def _post(self, change: Callable[[], None]) -> None:
        def apply() -> None:
            change()
            self._wake.set()

        if self._loop is None:
            return
        try:
            self._loop.call_soon_threadsafe(apply)
        except RuntimeError:
            pass  # the loop is closed: the server is gone

    # the loop side

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            try:
                await self._step()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("server %d: cluster update failed; retrying", self.server_id)
                await asyncio.sleep(self._retry_s)
                self._wake.set()

    def _grace_over(self) -> None:
        self._grace = None
        self._wake.set()

    async def _step(self) -> None:
        while self._states:
            await self._on_connection(self._states.pop(0))
        if self._lost:
            return
        if self._children is not None:
            children = self._children
            self._registered = live_server_ids(children)
            self._descriptors_seen = await asyncio.to_thread(self._descriptors, self._registered)
            if self._peers is not None:
                self._peers.set_peers({sid: f"{d.host}:{d.port}" for sid, d in self._descriptors_seen.items()})
            self._recheck = True
            if self._children is children:
                self._children = None
        wait = self._assign_after - asyncio.get_running_loop().time()
        if self._recheck and self._registered is not None and wait > 0:
            if self._grace is None:  # assign once the grace is over (_recheck stays set)
                self._grace = asyncio.get_running_loop().call_later(wait, self._grace_over)
        elif self._recheck and self._registered is not None:
            self._recheck = False
            live = self._peers.alive(self._registered) if self._peers is not None else self._registered
            await asyncio.to_thread(self._reassign, live, self._descriptors_seen)
        if self._assignment is not None:
            data = self._assignment
            message = metadata_pb2.ServerAssignment()
            message.ParseFromString(data)
            await self.manager.apply(owned_by(message, self.server_id))
            if self._assignment is data:
                self._assignment = None

    async def _on_connection(self, state: str) -> None:
        # Owned partitions go on serving whatever the ZooKeeper connection: their store sessions are what keeps
        # an old owner from committing (docs/failover.md), not this server's view of ZooKeeper. Only what needs
        # ZooKeeper waits for it: assignments, new store sessions (and so recovery), client ids.
        if state == KazooState.SUSPENDED:
            log.warning("server %d: ZooKeeper connection suspended: owned partitions go on serving; ownership "
                        "changes, new store sessions and client ids wait for it", self.server_id)
            await self._notify(False)
        elif state == KazooState.LOST:
            log.warning("server %d: ZooKeeper session lost: owned partitions go on serving until a newer owner "
                        "fences them or the assignment names another server; registering again once ZooKeeper "
                        "answers", self.server_id)
            self._lost = True
            await self._notify(False)
        elif state == KazooState.CONNECTED:
            if self._lost:
                await asyncio.to_thread(self._register)
                children = await asyncio.to_thread(self.zk.get_children, self.paths.servers)
                data, _ = await asyncio.to_thread(self.zk.get, self.paths.server_assignment)
                self._children, self._assignment = children, data
                self._lost = False
                self._assign_after = asyncio.get_running_loop().time() + REJOIN_GRACE_S
                log.info("server %d: ZooKeeper session re-established: registered again; partitions still "
                         "assigned here at the same generation stay open", self.server_id)
            await self._notify(True)

    async def _notify(self, connected: bool) -> None:
        if self._on_connected is not None:
            await self._on_connected(connected)
