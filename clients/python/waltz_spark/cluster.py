"""Where a cluster's partitions live (ZooKeeper) and their committed high-water marks (GetHighWaterMark)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import grpc

from waltz.v1 import metadata_pb2, server_pb2, server_pb2_grpc
from waltz_common import tls
from waltz_common import zk as zkmeta
from waltz_common.cluster_admin import parse_partitions
from waltz_common.tls import TlsFiles
from waltz_common.zk_security import ZkSecurity

T = TypeVar("T")

CHANNEL_OPTIONS = [("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)]
RETRYABLE = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.ABORTED,
        grpc.StatusCode.DEADLINE_EXCEEDED,
    }
)
"""Codes after which the partition may have moved or its server restarted: look its owner up again."""


class PartitionUnavailable(RuntimeError):
    """No live server owns the partition right now (or it did not answer); worth trying again later."""


class ClusterDirectory:
    """A ZooKeeper session on one cluster: its partition count and the server that owns each partition."""

    def __init__(
        self,
        zookeeper: str,
        root: str,
        timeout_s: float = 10.0,
        tls_files: TlsFiles | None = None,
        zk_security: ZkSecurity | None = None,
        servers: tuple[str, ...] = (),
    ) -> None:
        """With servers, everything comes from their GetClusterInfo and ZooKeeper is never contacted."""
        self.paths = zkmeta.ZkPaths(root or "/")
        self.where = ",".join(servers) if servers else root
        self.tls_files = tls_files
        self.timeout_s = timeout_s
        self._servers = servers
        self._zk = None if servers else zkmeta.connect(zookeeper, timeout_s=timeout_s, security=zk_security)
        self._channels: dict[str, grpc.Channel] = {}
        self._known_owners: dict[int, str] | None = None
        self.lookups = 0
        """Owner lookups made (ZooKeeper reads or GetClusterInfo calls): a streaming query's driver makes one,
        and another only after a partition was not where it was known to be."""

    def close(self) -> None:
        for channel in self._channels.values():
            channel.close()
        self._channels.clear()
        if self._zk is not None:
            self._zk.stop()
            self._zk.close()

    def __enter__(self) -> ClusterDirectory:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def num_partitions(self) -> int:
        if self._zk is None:
            return self._cluster_info().num_partitions
        return zkmeta.store_params(self._zk, self.paths).num_partitions

    def _cluster_info(self) -> server_pb2.ClusterInfoResponse:
        """GetClusterInfo from the first of the servers that answers."""
        failures = []
        for server in self._servers:
            stub = server_pb2_grpc.WaltzServerStub(self.channel(server))
            try:
                info: server_pb2.ClusterInfoResponse = stub.GetClusterInfo(
                    server_pb2.ClusterInfoRequest(), timeout=self.timeout_s
                )
                return info
            except grpc.RpcError as exc:
                failures.append(f"{server}: {describe(exc)}")
        raise PartitionUnavailable("no Waltz server answered: " + "; ".join(failures))

    def select(self, spec: str | None) -> list[int]:
        """The partitions a spec like "0-3,5" names (all when None), checked against the cluster."""
        count = self.num_partitions()
        if spec is None:
            return list(range(count))
        try:
            return parse_partitions(spec, count)
        except ValueError as exc:
            raise ValueError(f"option 'partitions': {exc}") from None

    def owners(self) -> dict[int, str]:
        """host:port of the live server owning each owned partition, looked up now."""
        self.lookups += 1
        self._known_owners = self._owners()
        return dict(self._known_owners)

    def known_owners(self) -> dict[int, str]:
        """The owners as last looked up (looked up when never): where a partition was when planned."""
        if self._known_owners is None:
            return self.owners()
        return dict(self._known_owners)

    def _owners(self) -> dict[int, str]:
        if self._zk is None:
            return {p.partition_id: p.address for p in self._cluster_info().partitions if p.address}
        found = zkmeta.read(self._zk, self.paths.server_assignment, metadata_pb2.ServerAssignment)
        if found is None:
            return {}
        addresses: dict[int, str | None] = {}
        result = {}
        for ownership in found[0].partitions:
            sid = ownership.server_id
            if sid < 0:
                continue
            if sid not in addresses:
                descriptor = zkmeta.read(self._zk, self.paths.server(sid), metadata_pb2.ServerDescriptor)
                addresses[sid] = f"{descriptor[0].host}:{descriptor[0].port}" if descriptor else None
            address = addresses[sid]
            if address is not None:
                result[ownership.partition_id] = address
        return result

    def owner(self, partition: int) -> str:
        address = self.owners().get(partition)
        if address is None:
            raise PartitionUnavailable(f"partition {partition} has no live server in {self.where}")
        return address

    def channel(self, address: str) -> grpc.Channel:
        if address not in self._channels:
            self._channels[address] = tls.channel(address, self.tls_files, CHANNEL_OPTIONS)
        return self._channels[address]

    def high_water_marks(self, partitions: Iterable[int]) -> dict[int, int]:
        """The committed high-water mark of each partition, asking each partition's owner (-1: empty).

        The owners known from the last lookup are asked first, all at once; the owners are looked up again
        only after a failure (the partition moved or its server went away), then the calls are retried.
        """
        wanted = list(partitions)
        return with_retry(lambda: self._high_water_marks(wanted), self.timeout_s, "high-water marks")

    def _high_water_marks(self, partitions: list[int]) -> dict[int, int]:
        with self._owners_may_move():
            calls = {}
            for pid in partitions:
                stub = server_pb2_grpc.WaltzServerStub(self.channel(self._known_owner(pid)))
                request = server_pb2.HighWaterMarkRequest(partition_id=pid)
                calls[pid] = stub.GetHighWaterMark.future(request, timeout=self.timeout_s)
            return {pid: int(call.result().high_water_mark) for pid, call in calls.items()}

    def _known_owner(self, partition: int) -> str:
        address = self.known_owners().get(partition)
        if address is None:
            raise PartitionUnavailable(f"partition {partition} has no live server in {self.where}")
        return address

    @contextmanager
    def _owners_may_move(self) -> Iterator[None]:
        """A failed call to a known owner makes the next try look the owners up again."""
        try:
            yield
        except (grpc.RpcError, PartitionUnavailable):
            self._known_owners = None
            raise


    def sample_sizes(self, partition: int, last: int, batch_size: int = 0, count: int = 16) -> tuple[int, int]:
        """(data bytes, records) of the newest count records up to last: what a record of the partition weighs."""
        first = max(0, last - count + 1)

        def sample() -> tuple[int, int]:
            with self._owners_may_move():
                stub = server_pb2_grpc.WaltzServerStub(self.channel(self._known_owner(partition)))
                request = server_pb2.ReadTransactionsRequest(
                    partition_id=partition, from_transaction_id=first, to_transaction_id=last, batch_size=batch_size
                )
                responses = stub.ReadTransactions(request, timeout=self.timeout_s)
                sizes = [r.data_length for message in responses for r in message.records]
                return sum(sizes), len(sizes)

        return with_retry(sample, self.timeout_s, f"record sizes of partition {partition}")


def with_retry(call: Callable[[], T], timeout_s: float, what: str) -> T:
    """call(), again after retryable gRPC errors or PartitionUnavailable until timeout_s has passed."""
    deadline = time.monotonic() + timeout_s
    delay = 0.05
    while True:
        try:
            return call()
        except (grpc.RpcError, PartitionUnavailable) as exc:
            if not is_retryable(exc) or time.monotonic() + delay > deadline:
                raise PartitionUnavailable(f"cannot get {what}: {describe(exc)}") from None
        time.sleep(delay)
        delay = min(delay * 2, 1.0)


def is_retryable(exc: BaseException) -> bool:
    if isinstance(exc, PartitionUnavailable):
        return True
    code: Any = exc.code() if isinstance(exc, grpc.RpcError) and hasattr(exc, "code") else None
    return code in RETRYABLE


def describe(exc: BaseException) -> str:
    """One line for an exception, gRPC errors as CODE: details."""
    if isinstance(exc, grpc.RpcError) and hasattr(exc, "code"):
        return f"{exc.code().name}: {exc.details()}"
    return str(exc)
