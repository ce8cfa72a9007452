"""The server's pool of storage connections: one StorageConnection per storage node, shared by all partitions."""

from __future__ import annotations

import asyncio
import logging

from kazoo.client import KazooClient

from waltz_common import zk as zkmeta
from waltz_common.zk import ZkPaths
from waltz_server.store.connection import StorageConnection, StorageConnectionLost
from waltz_server.store.settings import StoreSettings

log = logging.getLogger(__name__)

IDLE_CLOSE_S = 30.0
"""Seconds a connection no store session uses stays open (a session ending at a checkpoint is followed at
once by the next, which takes the same connections back), before it is closed and forgotten."""


class StorageConnections:
    """The server's connections, one per storage node, shared by all partitions: opened when a store
    session first needs the node, closed once no session has used it for idle_close_s seconds (so a
    storage node removed from the cluster is not reconnected to, nor reported by health, for ever)."""

    def __init__(
        self,
        cluster_key: str,
        num_partitions: int,
        settings: StoreSettings | None = None,
        *,
        idle_close_s: float = IDLE_CLOSE_S,
    ) -> None:
        self._cluster_key = cluster_key
        self._num_partitions = num_partitions
        self.settings = settings or StoreSettings()
        self._idle_close_s = idle_close_s
        self._connections: dict[str, StorageConnection] = {}
        self._users: dict[str, int] = {}
        self._idle: dict[str, asyncio.TimerHandle] = {}
        self._closing: set[asyncio.Task[None]] = set()
        self._closed = False

    @classmethod
    async def from_zookeeper(
        cls, zk: KazooClient, paths: ZkPaths, settings: StoreSettings | None = None
    ) -> StorageConnections:
        """A pool for the cluster at paths: its cluster key and partition count come from <root>/store."""
        params = await asyncio.to_thread(zkmeta.store_params, zk, paths)
        return cls(params.cluster_key, params.num_partitions, settings)

    def get(self, connect_string: str) -> StorageConnection:
        """The connection to connect_string, started on first use (call from the event loop). Each get
        is matched by a release() once the caller no longer uses the connection."""
        if self._closed:
            raise StorageConnectionLost("the storage connections are closed")
        idle = self._idle.pop(connect_string, None)
        if idle is not None:
            idle.cancel()
        connection = self._connections.get(connect_string)
        if connection is None:
            connection = StorageConnection(connect_string, self._cluster_key, self._num_partitions, self.settings)
            self._connections[connect_string] = connection
            connection.start()
        self._users[connect_string] = self._users.get(connect_string, 0) + 1
        return connection

    def release(self, connect_string: str) -> None:
        """A get() of connect_string ended; the last one starts the idle countdown."""
        users = self._users.get(connect_string, 0) - 1
        if users > 0:
            self._users[connect_string] = users
            return
        self._users.pop(connect_string, None)
        if not self._closed and connect_string in self._connections and connect_string not in self._idle:
            loop = asyncio.get_running_loop()
            self._idle[connect_string] = loop.call_later(self._idle_close_s, self._close_idle, connect_string)

    def _close_idle(self, connect_string: str) -> None:
        self._idle.pop(connect_string, None)
        connection = self._connections.pop(connect_string, None)
        if connection is not None:
            log.info("storage %s: no store session uses it any more, closing", connect_string)
            task = asyncio.get_running_loop().create_task(connection.close())
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)

    @property
    def closed(self) -> bool:
        return self._closed

    def is_connected(self, connect_string: str) -> bool:
        connection = self._connections.get(connect_string)
        return connection is not None and connection.connected

    async def close(self) -> None:
        self._closed = True
        for idle in self._idle.values():
            idle.cancel()
        self._idle.clear()
        connections, self._connections = list(self._connections.values()), {}
        for connection in connections:
            await connection.close()
        if self._closing:
            await asyncio.gather(*self._closing, return_exceptions=True)

    async def check_connectivity(self) -> dict[str, tuple[bool, str]]:
        """connect string -> (connected, why not) for every storage node in use."""
        return {
            name: (c.connected, "connected" if c.connected else c.last_error)
            for name, c in sorted(self._connections.items())
        }

    async def __aenter__(self) -> StorageConnections:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()
