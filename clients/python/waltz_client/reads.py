"""AsyncWaltzClient's reads: a partition's high-water mark from its server, a committed transaction's data (one, or a
range with one ReadTransactions call), and the blocking forms Transaction.data() calls from the callback thread."""

from __future__ import annotations

import asyncio
import logging
import threading

import grpc

from waltz.v1 import server_pb2
from waltz_client.config import ClientConfig
from waltz_client.driver import Driver, Topology
from waltz_client.errors import TransactionDataError, WaltzClosedError, WaltzError, WaltzTimeoutError
from waltz_client.partition import ClientPartition
from waltz_client.wire import req_id_to_proto
from waltz_common.types import ReqId, crc32

log = logging.getLogger("waltz_client.client")  # the client's log, as before the split
# what GetHighWaterMark answers while a partition moves or recovers: ask again (AsyncWaltzClient.high_water_mark)
_ASK_AGAIN = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.FAILED_PRECONDITION)

DATA_ATTEMPTS = 5  # original: up to 5 tries on a checksum mismatch


class ClientReads:
    """AsyncWaltzClient's reads (a mixin: the state is the client's, declared here for the type checker)."""

    config: ClientConfig
    client_id: int
    _driver: Driver
    _topology: Topology
    _topology_event: asyncio.Event
    _partitions: dict[int, ClientPartition]
    _closed: bool
    _loop: asyncio.AbstractEventLoop | None
    _loop_thread: threading.Thread | None

    def _check_open(self) -> None:
        raise NotImplementedError

    def _check_partition(self, pid: int) -> None:
        raise NotImplementedError

    def _check_process(self) -> None:
        raise NotImplementedError

    async def high_water_mark(self, partition_id: int) -> int:
        """The partition's current high-water mark, asked of its server (-1: empty). While the partition is not
        ready on its owner (recovering after a move: UNAVAILABLE) or has just moved (FAILED_PRECONDITION), asks
        again, of the owner as the client then knows it, until client.requestTimeout; other errors raise at once."""
        self._check_open()
        self._check_partition(partition_id)
        loop = asyncio.get_running_loop()
        timeout = self.config.request_timeout_s
        deadline = loop.time() + timeout
        delay = 0.05
        while True:
            endpoint = await self._endpoint(partition_id)
            left = max(0.001, deadline - loop.time())
            try:
                return await asyncio.wait_for(self._driver.get_high_water_mark(endpoint, partition_id, left), left)
            except grpc.aio.AioRpcError as exc:
                if exc.code() not in _ASK_AGAIN or loop.time() + delay >= deadline or self._closed:
                    raise
                log.debug("partition %d: the high-water mark is not available yet (%s); asking again in %.2f s",
                          partition_id, exc.details(), delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 1.0)

    async def _server_high_water_mark(self, endpoint: str, partition_id: int) -> int:
        return await self._driver.get_high_water_mark(endpoint, partition_id, self.config.request_timeout_s)

    async def transaction_data(self, partition_id: int, transaction_id: int) -> bytes:
        """A committed transaction's data, checksum verified, with bounded retries."""
        self._check_process()
        timeout = self.config.request_timeout_s
        problem = "not tried"
        for attempt in range(DATA_ATTEMPTS):
            if self._closed:
                raise WaltzClosedError(f"the client was closed while fetching transaction {transaction_id}")
            if attempt:
                await asyncio.sleep(0.01 * 3**attempt)
            owner = self._topology.get(partition_id)
            if owner is None or owner.endpoint is None:
                problem = "no server owns the partition"
                continue
            request = server_pb2.TransactionDataRequest(
                req_id=req_id_to_proto(self._rpc_req_id(partition_id)), transaction_id=transaction_id)
            try:
                response = await asyncio.wait_for(
                    self._driver.get_transaction_data(owner.endpoint, request, timeout), timeout)
            except Exception as exc:
                problem = f"{type(exc).__name__}: {exc}"
                continue
            if not response.success:
                problem = response.error_message or "the server could not read it"
            elif response.data_length != len(response.data) or crc32(response.data) != response.checksum:
                problem = "checksum or length mismatch"
            else:
                return response.data
        raise TransactionDataError(
            f"partition {partition_id}, transaction {transaction_id}: {problem} ({DATA_ATTEMPTS} attempts)")

    async def transaction_range(self, partition_id: int, first: int, last: int) -> dict[int, bytes]:
        """Committed transactions first..last's data by id, checksums verified, in one ReadTransactions call
        (no retries: Transaction.data() falls back to transaction_data, which has them)."""
        owner = self._topology.get(partition_id)
        if owner is None or owner.endpoint is None:
            raise TransactionDataError(f"partition {partition_id}: no server owns the partition")
        timeout = self.config.request_timeout_s
        records = await asyncio.wait_for(
            self._driver.read_transactions(owner.endpoint, partition_id, first, last, timeout), timeout)
        data: dict[int, bytes] = {}
        for record in records:
            if record.data_length != len(record.data) or crc32(record.data) != record.checksum:
                raise TransactionDataError(f"partition {partition_id}, transaction {record.transaction_id}: "
                                           "checksum or length mismatch")
            data[record.transaction_id] = record.data
        return data

    def _fetch_range_blocking(self, pid: int, first: int, last: int) -> dict[int, bytes]:
        self._check_fetch_thread()
        assert self._loop is not None
        return asyncio.run_coroutine_threadsafe(self.transaction_range(pid, first, last), self._loop).result()

    def _fetch_blocking(self, pid: int, transaction_id: int) -> bytes:
        self._check_fetch_thread()
        assert self._loop is not None
        return asyncio.run_coroutine_threadsafe(self.transaction_data(pid, transaction_id), self._loop).result()

    def _check_fetch_thread(self) -> None:
        if threading.current_thread() is self._loop_thread or self._loop is None:
            if not self.config.callback_thread:
                raise WaltzError(
                    "Transaction.data() cannot fetch another client's data with client.callbackThread false "
                    "(callbacks run on the event loop, which the fetch needs): use AsyncWaltzClient.transaction_data "
                    "outside the callbacks, or the callback thread")
            raise WaltzError("Transaction.data() blocks: call it from apply_transaction, not on the event loop")

    async def _endpoint(self, partition_id: int) -> str:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config.mount_timeout_s
        while True:
            owner = self._topology.get(partition_id)
            if owner is not None and owner.endpoint is not None:
                return owner.endpoint
            try:
                async with asyncio.timeout(max(0.0, deadline - loop.time())):
                    await self._topology_event.wait()
            except TimeoutError:
                raise WaltzTimeoutError(f"no server owns partition {partition_id}") from None

    def _rpc_req_id(self, partition_id: int) -> ReqId:
        partition = self._partitions.get(partition_id)
        if partition is not None:
            return partition.state.next_req_id()
        return ReqId(self.client_id, 0, partition_id, 0)
