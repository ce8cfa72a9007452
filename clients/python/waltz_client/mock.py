"""An in-memory Waltz server and driver for application unit tests, with fault injection."""

from __future__ import annotations

import asyncio
import random
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from waltz.v1 import common_pb2, server_pb2
from waltz_client.driver import ClusterInfo, Driver, Ownership, ServerStream, Topology
from waltz_client.errors import StreamClosedError
from waltz_client.wire import req_id_from_proto, req_id_to_proto
from waltz_common.types import Record, crc32

ENDPOINT = "mock:0"
_CLOSED = object()


@dataclass
class _Partition:
    log: list[Record] = field(default_factory=list)
    locks: dict[int, int] = field(default_factory=dict)  # lock hash -> last transaction that took it
    generation: int = 0
    available: bool = True
    mounts: dict[int, _MockStream] = field(default_factory=dict)  # client id -> registered stream

    @property
    def high_water_mark(self) -> int:
        return len(self.log) - 1


class MockServer:
    """Server semantics in one process: dense ids, the lock table, feeds to every client.

    Share one between several clients (`AsyncWaltzClient(cb, driver=server)`); clients may run
    on different event loops and threads. Exact lock table (no false positives). Faults:
    force_next_append_fail (dropped silently: the client must detect it), force_next_lock_fail,
    set_fault_rate, set_max_delay (per request, order kept), suspend_feed / resume_feed (the
    live feed after a mount; a mount's catch-up is always sent), end_feeds, restart_partition,
    hold_requests / release_requests (requests wait unprocessed), disconnect (cut streams,
    dropping what is in flight either way), set_partition_available (mounts answer NOT_READY),
    bump_generation (a failover), corrupt_next_data (a bad checksum from GetTransactionData),
    deny_client_id (its mounts and appends answered PERMISSION_DENIED, as a mutual TLS server answers another
    identity's).
    """

    def __init__(self, num_partitions: int = 1, cluster_name: str = "mock") -> None:
        if num_partitions < 1:
            raise ValueError("num_partitions must be at least 1")
        self.num_partitions = num_partitions
        self.cluster_name = cluster_name
        self._lock = threading.RLock()
        self._partitions = [_Partition() for _ in range(num_partitions)]
        self._streams: set[_MockStream] = set()
        self._drivers: set[MockDriver] = set()
        self._next_client_id = 0
        self._fail_appends = 0
        self._fail_locks = 0
        self._corrupt_data = 0
        self._fault_rate = 0.0
        self.max_delay = 0.0
        self.max_transaction_bytes = 4 * 1024 * 1024
        self.held = False
        self._feed_suspended = False
        self._random = random.Random(0)
        self.append_batch_sizes: list[int] = []  # appends per AppendBatch message, for batching tests
        self._denied: set[int] = set()
        self.feed_batch_size = 1000  # feed entries per FeedDataBatch message (as server.feedBatchSize)
        self.data_calls = 0  # GetTransactionData calls (one transaction each), for batching tests
        self.read_calls = 0  # ReadTransactions calls (a range each)
        self.high_water_mark_calls = 0  # GetHighWaterMark calls

    def driver(self) -> MockDriver:
        """A driver for one client of this server."""
        return MockDriver(self)

    # ---- fault injection ------------------------------------------------------------------

    def force_next_append_fail(self, count: int = 1) -> None:
        with self._lock:
            self._fail_appends += count

    def force_next_lock_fail(self, count: int = 1) -> None:
        with self._lock:
            self._fail_locks += count

    def corrupt_next_data(self, count: int = 1) -> None:
        with self._lock:
            self._corrupt_data += count

    def deny_client_id(self, client_id: int) -> None:
        """Answer the client id's mounts and appends PERMISSION_DENIED from now on."""
        with self._lock:
            self._denied.add(client_id)

    def set_fault_rate(self, rate: float) -> None:
        """Drop this fraction of appends silently (seeded, so runs repeat)."""
        with self._lock:
            self._fault_rate = rate

    def set_max_delay(self, seconds: float) -> None:
        self.max_delay = seconds

    def hold_requests(self) -> None:
        self.held = True

    def release_requests(self) -> None:
        self.held = False

    def suspend_feed(self) -> None:
        with self._lock:
            self._feed_suspended = True

    def resume_feed(self) -> None:
        with self._lock:
            self._feed_suspended = False
            for stream in list(self._streams):
                for pid in list(stream.cursors):
                    self._push_feed(stream, pid)

    def end_feeds(self) -> None:
        """Every stream's live feed ends silently (as a server whose feed task died)."""
        with self._lock:
            for stream in self._streams:
                stream.cursors.clear()

    def restart_partition(self, partition_id: int) -> None:
        """The server closes the partition and opens it again, same owner and generation (a restart after a
        failure): each of its feeds ends with an unasked NOT_READY for the mount that started it."""
        with self._lock:
            partition = self._partitions[partition_id]
            for stream in partition.mounts.values():
                stream.cursors.pop(partition_id, None)
                stream.deliver(server_pb2.ServerMessage(mount=server_pb2.MountResponse(
                    req_id=stream.mounts.pop(partition_id), partition_ready=False,
                    state=server_pb2.MountResponse.NOT_READY, high_water_mark=partition.high_water_mark)))
            partition.mounts.clear()

    def disconnect(self, client_id: int | None = None) -> int:
        """Cut the streams (of one client, or all); requests not yet processed are lost."""
        with self._lock:
            cut = [s for s in self._streams if client_id is None or s.client_id == client_id]
            for stream in cut:
                self._forget(stream)
                stream.cut()
            return len(cut)

    def set_partition_available(self, partition_id: int, available: bool) -> None:
        with self._lock:
            self._partitions[partition_id].available = available

    def bump_generation(self, partition_id: int) -> None:
        """A failover: the partition gets a new generation and every client must remount."""
        with self._lock:
            partition = self._partitions[partition_id]
            partition.generation += 1
            partition.mounts.clear()
            partition.locks.clear()  # a new owner starts with an empty lock table
            for stream in self._streams:
                stream.cursors.pop(partition_id, None)
            drivers = list(self._drivers)
        for driver in drivers:
            driver.topology_changed()

    # ---- inspection -----------------------------------------------------------------------

    def high_water_mark(self, partition_id: int) -> int:
        with self._lock:
            return self._partitions[partition_id].high_water_mark

    def records(self, partition_id: int) -> list[Record]:
        with self._lock:
            return list(self._partitions[partition_id].log)

    def topology(self) -> dict[int, Ownership]:
        with self._lock:
            return {pid: Ownership(ENDPOINT, p.generation) for pid, p in enumerate(self._partitions)}

    # ---- protocol -------------------------------------------------------------------------

    def connect(self, client_id: int = -1) -> ServerStream:
        """A new stream on the running event loop (client_id -1: learnt from the first request);
        lets a test serve this mock over real gRPC."""
        stream = _MockStream(self, client_id, asyncio.get_running_loop())
        self._attach(stream)
        return stream

    def _new_client(self, driver: MockDriver) -> int:
        with self._lock:
            self._next_client_id += 1
            self._drivers.add(driver)
            return self._next_client_id

    def _attach(self, stream: _MockStream) -> None:
        with self._lock:
            self._streams.add(stream)

    def _forget(self, stream: _MockStream) -> None:
        with self._lock:
            self._streams.discard(stream)
            for partition in self._partitions:
                if partition.mounts.get(stream.client_id) is stream:
                    del partition.mounts[stream.client_id]

    def handle(self, stream: _MockStream, message: server_pb2.ClientMessage) -> None:
        with self._lock:
            if stream.closed:
                return  # lost in the cut
            kind = message.WhichOneof("message")
            if kind == "mount":
                self._mount(stream, message.mount)
            elif kind == "appends":
                self.append_batch_sizes.append(len(message.appends.requests))
                for request in message.appends.requests:
                    self._append(stream, request)
            elif kind == "feed":
                pid = message.feed.req_id.partition_id
                if self._partitions[pid].mounts.get(stream.client_id) is stream:
                    stream.cursors[pid] = message.feed.client_high_water_mark + 1
                    self._push_feed(stream, pid)
            elif kind == "flush":
                pid = message.flush.req_id.partition_id
                stream.deliver(server_pb2.ServerMessage(flush=server_pb2.FlushResponse(
                    req_id=message.flush.req_id, transaction_id=self._partitions[pid].high_water_mark)))

    def _mount(self, stream: _MockStream, request: server_pb2.MountRequest) -> None:
        pid = request.req_id.partition_id
        partition = self._partitions[pid]
        stream.cursors.pop(pid, None)
        state = server_pb2.MountResponse.READY
        if request.req_id.client_id in self._denied:
            state = server_pb2.MountResponse.PERMISSION_DENIED
        elif not partition.available or request.req_id.generation != partition.generation:
            state = server_pb2.MountResponse.NOT_READY
        elif request.client_high_water_mark > partition.high_water_mark:
            state = server_pb2.MountResponse.CLIENT_AHEAD
        else:
            partition.mounts[stream.client_id] = stream
            self._send_feed(stream, partition.log[request.client_high_water_mark + 1:])
        stream.deliver(server_pb2.ServerMessage(mount=server_pb2.MountResponse(
            req_id=request.req_id, partition_ready=state == server_pb2.MountResponse.READY, state=state,
            high_water_mark=partition.high_water_mark,
            message="client id belongs to another identity" if request.req_id.client_id in self._denied else "")))
        if state == server_pb2.MountResponse.READY:
            stream.cursors[pid] = len(partition.log)  # the feed goes on after the mount
            stream.mounts[pid] = request.req_id

    def _append(self, stream: _MockStream, request: server_pb2.AppendRequest) -> None:
        pid = request.req_id.partition_id
        partition = self._partitions[pid]

        def reject(reason: int, text: str) -> None:
            stream.deliver(server_pb2.ServerMessage(append_rejected=server_pb2.AppendRejected(
                req_id=request.req_id, reason=reason, message=text)))  # type: ignore[arg-type]

        def lock_failure(txn_id: int) -> None:
            stream.deliver(server_pb2.ServerMessage(lock_failure=server_pb2.LockFailure(
                req_id=request.req_id, transaction_id=txn_id)))

        if request.req_id.client_id in self._denied:
            return reject(server_pb2.AppendRejected.PERMISSION_DENIED, "client id belongs to another identity")
        if partition.mounts.get(stream.client_id) is not stream:
            return reject(server_pb2.AppendRejected.NOT_MOUNTED, f"partition {pid} is not mounted on this stream")
        if request.req_id.generation != partition.generation:
            return reject(server_pb2.AppendRejected.WRONG_GENERATION, f"generation is {partition.generation}")
        if not partition.available:
            return reject(server_pb2.AppendRejected.PARTITION_NOT_READY, f"partition {pid} is not available")
        if request.data_length != len(request.data) or crc32(request.data) != request.checksum:
            return reject(server_pb2.AppendRejected.INVALID, "checksum or data length mismatch")
        if len(request.data) > self.max_transaction_bytes:
            return reject(server_pb2.AppendRejected.INVALID,
                          f"{len(request.data)} bytes of data, more than the limit {self.max_transaction_bytes}")
        if self._fail_appends or self._random.random() < self._fault_rate:
            self._fail_appends = max(0, self._fail_appends - 1)
            return None  # lost without a word, as a crashed server would
        if self._fail_locks:
            self._fail_locks -= 1
            return lock_failure(partition.high_water_mark)
        checked = list(request.write_locks) + list(request.read_locks)
        lock_hwm = max((partition.locks.get(h, -1) for h in checked), default=-1)
        if lock_hwm > request.client_high_water_mark:
            return lock_failure(lock_hwm)
        txn_id = len(partition.log)
        partition.log.append(Record(txn_id, req_id_from_proto(request.req_id), request.header,
                                    bytes(request.data), request.checksum))
        for h in list(request.write_locks) + list(request.append_locks):
            partition.locks[h] = txn_id
        for other in list(self._streams):
            if pid in other.cursors:
                self._push_feed(other, pid)
        return None

    def _push_feed(self, stream: _MockStream, pid: int) -> None:
        if self._feed_suspended:
            return
        log = self._partitions[pid].log
        start = stream.cursors[pid]
        if start < len(log):
            stream.cursors[pid] = len(log)
            self._send_feed(stream, log[start:])

    def _send_feed(self, stream: _MockStream, records: list[Record]) -> None:
        size = max(1, self.feed_batch_size)
        for start in range(0, len(records), size):
            stream.deliver(server_pb2.ServerMessage(feed=server_pb2.FeedDataBatch(transactions=[
                server_pb2.FeedData(req_id=req_id_to_proto(r.req_id), transaction_id=r.transaction_id,
                                    header=r.header) for r in records[start:start + size]])))

    def transaction_data(self, request: server_pb2.TransactionDataRequest) -> server_pb2.TransactionDataResponse:
        with self._lock:
            self.data_calls += 1
            log = self._partitions[request.req_id.partition_id].log
            txn_id = request.transaction_id
            response = server_pb2.TransactionDataResponse(req_id=request.req_id, transaction_id=txn_id)
            if not 0 <= txn_id < len(log):
                response.error_message = f"transaction {txn_id} does not exist"
                return response
            record = log[txn_id]
            response.success = True
            response.data, response.data_length, response.checksum = record.data, len(record.data), record.checksum
            if self._corrupt_data:
                self._corrupt_data -= 1
                response.checksum ^= 1
            return response


class _MockStream(ServerStream):
    """Both ends of one in-memory stream; requests pass through a pump that can delay or hold."""

    def __init__(self, server: MockServer, client_id: int, loop: asyncio.AbstractEventLoop) -> None:
        self.server = server
        self.client_id = client_id
        self.closed = False
        self.cursors: dict[int, int] = {}  # partition -> next transaction id to feed
        self.mounts: dict[int, common_pb2.ReqId] = {}  # partition -> the mount its feed answered READY
        self._loop = loop
        self._requests: asyncio.Queue[server_pb2.ClientMessage] = asyncio.Queue()
        self._responses: asyncio.Queue[object] = asyncio.Queue()
        self._pump = loop.create_task(self._pump_loop(), name=f"mock-stream-{client_id}")

    async def _pump_loop(self) -> None:
        while True:
            message = await self._requests.get()
            while self.server.held and not self.closed:
                await asyncio.sleep(0.005)
            if self.server.max_delay > 0:
                await asyncio.sleep(random.uniform(0, self.server.max_delay))
            self.server.handle(self, message)

    def deliver(self, message: server_pb2.ServerMessage) -> None:
        """Server to client; callable from any thread."""
        if not self.closed:
            self._call_soon(self._responses.put_nowait, message)

    def cut(self) -> None:
        self.closed = True
        self._call_soon(self._cut)

    def _call_soon(self, fn: Callable[..., object], *args: object) -> None:
        try:
            self._loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:
            pass  # the client's loop is closed: nobody listens any more

    def _cut(self) -> None:
        self._pump.cancel()
        while not self._requests.empty():
            self._requests.get_nowait()
        while not self._responses.empty():
            self._responses.get_nowait()
        self._responses.put_nowait(_CLOSED)

    async def send(self, message: server_pb2.ClientMessage) -> None:
        if self.closed:
            raise StreamClosedError("mock stream closed")
        if self.client_id < 0:
            kind = message.WhichOneof("message")
            first = message.appends.requests[0] if kind == "appends" else getattr(message, kind or "mount")
            self.client_id = first.req_id.client_id
        self._requests.put_nowait(message)

    async def receive(self) -> server_pb2.ServerMessage:
        item = await self._responses.get()
        if item is _CLOSED:
            self._responses.put_nowait(_CLOSED)
            raise StreamClosedError("mock stream cut")
        assert isinstance(item, server_pb2.ServerMessage)
        return item

    async def close(self) -> None:
        if not self.closed:
            self.server._forget(self)
            self.cut()


class MockDriver(Driver):
    """One client's view of a MockServer."""

    def __init__(self, server: MockServer) -> None:
        self.server = server
        self._on_topology: Callable[[Topology], None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._streams: list[_MockStream] = []
        self.client_id = -1

    async def start(self, on_topology: Callable[[Topology], None]) -> ClusterInfo:
        self._loop = asyncio.get_running_loop()
        self._on_topology = on_topology
        self.client_id = self.server._new_client(self)
        on_topology(self.server.topology())
        return ClusterInfo(self.client_id, self.server.num_partitions, self.server.cluster_name)

    def topology_changed(self) -> None:
        if self._loop is not None and self._on_topology is not None:
            self._loop.call_soon_threadsafe(self._on_topology, self.server.topology())

    async def open_stream(self, endpoint: str) -> ServerStream:
        if endpoint != ENDPOINT:
            raise StreamClosedError(f"no mock server at {endpoint}")
        stream = self.server.connect(self.client_id)
        assert isinstance(stream, _MockStream)
        self._streams.append(stream)
        return stream

    async def get_transaction_data(
        self, endpoint: str, request: server_pb2.TransactionDataRequest, timeout: float
    ) -> server_pb2.TransactionDataResponse:
        return self.server.transaction_data(request)

    async def get_high_water_mark(self, endpoint: str, partition_id: int, timeout: float) -> int:
        self.server.high_water_mark_calls += 1
        return self.server.high_water_mark(partition_id)

    async def read_transactions(
        self, endpoint: str, partition_id: int, first: int, last: int, timeout: float
    ) -> list[common_pb2.Record]:
        self.server.read_calls += 1
        return [common_pb2.Record(transaction_id=r.transaction_id, req_id=req_id_to_proto(r.req_id), header=r.header,
                                  data_length=len(r.data), data=r.data, checksum=r.checksum)
                for r in self.server.records(partition_id)[first:last + 1]]

    async def close(self) -> None:
        with self.server._lock:
            self.server._drivers.discard(self)
        for stream in self._streams:
            await stream.close()
            stream._pump.cancel()
        await asyncio.gather(*(s._pump for s in self._streams), return_exceptions=True)
