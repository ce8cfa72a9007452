"""Discovery without ZooKeeper for clients: the cluster info and client ids every server hands out.

ClusterInfo (the pure part) turns the ownership a server last saw in ZooKeeper into the GetClusterInfo answer;
ClusterView is the thin shell that keeps it current from ZooKeeper watches and takes client ids from the counter.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from kazoo.client import KazooClient

from waltz.v1 import server_pb2
from waltz_common import zk as zkmeta
from waltz_common.topology import Topology, ZkTopologyWatcher, take_client_id


@dataclass(frozen=True, slots=True)
class ClusterInfo:
    """What GetClusterInfo answers, given the ownership last seen."""

    cluster_name: str
    num_partitions: int
    limits: server_pb2.Limits

    def response(self, topology: Topology, server_id: int) -> server_pb2.ClusterInfoResponse:
        """Every partition in id order; an unowned one (or one whose server is not registered) has no address."""
        owners = []
        for pid in range(self.num_partitions):
            owner = topology.get(pid)
            owners.append(
                server_pb2.PartitionOwner(
                    partition_id=pid,
                    address=(owner.endpoint or "") if owner is not None else "",
                    generation=owner.generation if owner is not None else 0,
                )
            )
        return server_pb2.ClusterInfoResponse(
            cluster_name=self.cluster_name,
            num_partitions=self.num_partitions,
            partitions=owners,
            limits=self.limits,
            server_id=server_id,
        )


class ClusterView:
    """The cluster's ownership as this server sees it in ZooKeeper, for GetClusterInfo; client ids for GetClientId."""

    def __init__(self, zk: KazooClient, paths: zkmeta.ZkPaths, info: ClusterInfo) -> None:
        self._zk = zk
        self._paths = paths
        self.info = info
        self._topology: Topology | None = None
        self._watcher: ZkTopologyWatcher | None = None

    async def start(self) -> None:
        loop = asyncio.get_running_loop()

        def report(topology: Topology) -> bool:
            try:
                loop.call_soon_threadsafe(setattr, self, "_topology", dict(topology))
                return True
            except RuntimeError:
                return False  # the loop is closed: stop watching

        self._watcher = ZkTopologyWatcher(self._zk, self._paths, report)
        await asyncio.to_thread(self._watcher.start)

    def stop(self) -> None:
        if self._watcher is not None:
            self._watcher.stop()

    def response(self, server_id: int) -> server_pb2.ClusterInfoResponse | None:
        """The GetClusterInfo answer; None until the assignment was read once."""
        if self._topology is None:
            return None
        return self.info.response(self._topology, server_id)

    async def take_client_id(self) -> int:
        return await asyncio.to_thread(take_client_id, self._zk, self._paths)
