"""The transport a client runs over: cluster discovery, server streams and unary calls."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass

from waltz.v1 import common_pb2, server_pb2
from waltz_common.topology import Ownership, Topology

__all__ = ["ClusterInfo", "Driver", "Ownership", "ServerStream", "Topology"]


@dataclass(frozen=True, slots=True)
class ClusterInfo:
    client_id: int
    num_partitions: int
    cluster_name: str


class ServerStream(ABC):
    """One ordered bidirectional Stream to one server."""

    @abstractmethod
    async def send(self, message: server_pb2.ClientMessage) -> None:
        """Send in order; raises StreamClosedError when the stream is gone."""

    @abstractmethod
    async def receive(self) -> server_pb2.ServerMessage:
        """The next message; raises StreamClosedError when the stream ends or fails."""

    @abstractmethod
    async def close(self) -> None:
        """End the stream (idempotent)."""


class Driver(ABC):
    """Everything a client needs from the outside world; gRPC + ZooKeeper, or the in-memory mock."""

    @abstractmethod
    async def start(self, on_topology: Callable[[Topology], None]) -> ClusterInfo:
        """Connect, take a client id; on_topology is called on the event loop with the first
        topology before or soon after this returns, and again whenever it changes."""

    @abstractmethod
    async def open_stream(self, endpoint: str) -> ServerStream:
        """A new stream to the server at endpoint; raises StreamClosedError if it cannot."""

    @abstractmethod
    async def get_transaction_data(
        self, endpoint: str, request: server_pb2.TransactionDataRequest, timeout: float
    ) -> server_pb2.TransactionDataResponse:
        """The unary GetTransactionData call."""

    @abstractmethod
    async def get_high_water_mark(self, endpoint: str, partition_id: int, timeout: float) -> int:
        """The unary GetHighWaterMark call."""

    async def read_transactions(
        self, endpoint: str, partition_id: int, first: int, last: int, timeout: float
    ) -> list[common_pb2.Record]:
        """Transactions first..last (committed) with their data: the ReadTransactions call. Optional: a driver
        without it makes the client fetch a batch's data one GetTransactionData call at a time."""
        raise NotImplementedError(f"{type(self).__name__} has no read_transactions")

    @abstractmethod
    async def close(self) -> None:
        """Release connections and the ZooKeeper session."""

    def refresh(self) -> None:  # noqa: B027  # optional: most drivers are told of changes
        """A server answered NOT_READY: look at the cluster again soon (drivers that poll for ownership)."""
