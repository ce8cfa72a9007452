"""A partition's admission of appends: each request of a client message validated and read once, then queued in
the append pipeline as an AdmittedAppend, or answered with its refusal (the append task, the store and the feeds are in
partition)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from waltz.v1 import common_pb2, server_pb2
from waltz_common.types import crc32_unsigned
from waltz_server.append_pipeline import AppendPipeline, ClientPending, QueuedAppend
from waltz_server.config import PartitionSettings
from waltz_server.feed import StreamPort
from waltz_server.locks import LockRequest
from waltz_server.metrics import PartitionMetrics
from waltz_server.mounts import MountRegistry
from waltz_server.partition_feeds import PartitionFeeds
from waltz_server.pending_batch import RECORD_BODY
from waltz_server.sequences import SequenceWindow
from waltz_server.validation import data_problem, lock_problem

Reason = server_pb2.AppendRejected.Reason
_NO_LOCKS = LockRequest()


@dataclass(slots=True, eq=False)
class _Message:
    """The client message appends came in: what their answers and their commit latency need, one per message."""

    stream: StreamPort
    arrived: float


class AdmittedAppend(QueuedAppend[_Message]):
    """A queued append with the fields the partition read from its request when it took it, so that nothing after
    reads them again: its ReqId's generation and sequence number, its header (the feed entry's fields, with the
    partition's id) and its record for the store (all but the transaction id: pending_batch)."""

    __slots__ = ("generation", "header", "record", "request", "seq_num")

    def __init__(
        self,
        client_id: int,
        client_high_water_mark: int,
        locks: LockRequest,
        size: int,
        origin: _Message,
        ticket: int,
        request: server_pb2.AppendRequest,
        generation: int,
        seq_num: int,
        header: int,
        record: bytes,
    ) -> None:
        self.client_id = client_id
        self.client_high_water_mark = client_high_water_mark
        self.locks = locks
        self.size = size
        self.origin = origin
        self.ticket = ticket
        self.checked = -1
        self.request = request
        self.generation = generation
        self.seq_num = seq_num
        self.header = header
        self.record = record


def rejected(
    request_req_id: common_pb2.ReqId, reason: Reason.ValueType, message: str, transaction_id: int = -1
) -> server_pb2.ServerMessage:
    return server_pb2.ServerMessage(
        append_rejected=server_pb2.AppendRejected(
            req_id=request_req_id, reason=reason, message=message, transaction_id=transaction_id
        )
    )


class AppendAdmission:
    """Partition's intake of appends, over the state the Partition keeps (declared here)."""

    partition_id: int
    generation: int
    settings: PartitionSettings
    metrics: PartitionMetrics | None
    feeds: PartitionFeeds
    _closed: bool
    _pipeline: AppendPipeline[AdmittedAppend] | None
    _pending: ClientPending[Callable[[], None]]
    _mounts: MountRegistry
    _sequences: SequenceWindow

    def _submit_some(
        self,
        stream: StreamPort,
        requests: Sequence[server_pb2.AppendRequest],
        arrived: float,
        others: list[server_pb2.AppendRequest],
    ) -> None:
        """Validate and queue requests (the queue has room for them); those of other partitions go to others.

        Runs once per append: each field of a request is read here once (a protobuf field read costs about as much
        as the check it feeds), and what the rest of the path needs is kept on its AdmittedAppend: the store's
        record but for its id, the feed entry's ReqId and header."""
        pipeline, partition_id = self._pipeline, self.partition_id
        if self._closed or pipeline is None:
            message = f"partition {partition_id} is not ready here"
            for request in requests:
                if request.req_id.partition_id != partition_id:
                    others.append(request)
                    continue
                self._reject(stream, request.req_id, Reason.PARTITION_NOT_READY, message)
            return
        generation, stream_id, max_bytes = self.generation, stream.stream_id, self.settings.max_transaction_bytes
        max_locks, hwm = self.settings.max_locks_per_append, self.feeds.high_water_mark
        origin = _Message(stream, arrived)
        mounted: dict[int, bool] = {}  # client id -> this stream holds its current mount
        offer, offered, last_seq = pipeline.offer, self._pending.offered, self._sequences.last
        crc, pack = crc32_unsigned, RECORD_BODY.pack
        for request in requests:
            req_id = request.req_id
            if req_id.partition_id != partition_id:
                others.append(request)
                continue
            client_id, seq_num = req_id.client_id, req_id.seq_num
            current = mounted.get(client_id)
            if current is None:
                current = mounted[client_id] = self._mounts.is_current(client_id, stream_id)
            if not current:
                self._not_current(stream, req_id, client_id)
                continue
            last = last_seq.get(client_id)  # SequenceWindow.admit, written out: it runs once per append
            if last is not None and not 0 < (seq_num - last) & 0xFFFFFFFF < 0x80000000:
                # before the generation: a re-send may carry the old one
                self._resent(stream, req_id, client_id, seq_num)
                continue
            last_seq[client_id] = seq_num
            if req_id.generation != generation:
                self._reject(stream, req_id, Reason.WRONG_GENERATION, self._generation_message(req_id.generation))
                continue
            data = request.data
            checksum = request.checksum
            problem = None
            size = len(data)  # data_problem's checks, written out; it says what is wrong when one fails
            if size > max_bytes or request.data_length != size or (checksum & 0xFFFFFFFF) != crc(data):
                problem = data_problem(request, data, max_bytes)
            client_hwm = request.client_high_water_mark
            if not -1 <= client_hwm <= hwm and problem is None:
                problem = self._client_mark_problem(client_hwm, hwm)
            locks = _NO_LOCKS
            write, read, append = request.write_locks, request.read_locks, request.append_locks
            if problem is None and (
                write
                or read
                or append
                or request.write_lock_request_length
                or request.read_lock_request_length
                or request.append_lock_request_length
            ):
                problem = lock_problem(request, write, read, append, max_locks)
                locks = LockRequest(tuple(write), tuple(read), tuple(append))
            if problem is not None:
                self._reject(stream, req_id, Reason.INVALID, f"partition {partition_id}: {problem}")
                continue
            header = request.header
            record = pack(client_id, generation, partition_id, seq_num, header, size, checksum) + data
            ticket = offered(client_id)
            offer(AdmittedAppend(client_id, client_hwm, locks, size, origin, ticket, request, generation, seq_num,
                                 header, record))

    def _client_mark_problem(self, client_hwm: int, hwm: int) -> str:
        """An append's client high-water mark outside -1 .. the partition's: its lock check would be meaningless
        (a mark above the log passes every check), so it is refused, never committed unchecked."""
        if client_hwm < -1:
            return f"client_high_water_mark {client_hwm} is below -1"
        return (
            f"client_high_water_mark {client_hwm} is above the partition's high-water mark {hwm}: the client claims "
            "transactions the log does not hold (a client ahead of the log: check its state, see CLIENT_AHEAD)"
        )

    def _not_current(self, stream: StreamPort, req_id: common_pb2.ReqId, client_id: int) -> None:
        if self._mounts.is_known(client_id):  # a stale network client: a newer stream of the client mounted it
            message = (
                f"partition {self.partition_id}: a newer stream of client {client_id} mounted the partition; "
                "this stream's appends are refused"
            )
            self._reject(stream, req_id, Reason.SUPERSEDED, message)
        else:
            message = f"partition {self.partition_id} is not mounted by client {client_id}: mount it first"
            self._reject(stream, req_id, Reason.NOT_MOUNTED, message)

    def _resent(self, stream: StreamPort, req_id: common_pb2.ReqId, client_id: int, seq_num: int) -> None:
        """An append whose sequence number is not after the client's last: answer it once the client's queued
        appends resolved (it may re-send one of them), with the transaction it committed as or a refusal."""

        def answer() -> None:
            resend = self._sequences.classify(client_id, seq_num)
            if resend.transaction_id is not None:
                message = (
                    f"partition {self.partition_id}: sequence number {seq_num} of client {client_id} already "
                    f"committed as transaction {resend.transaction_id}; not committed again"
                )
                stream.send_control(rejected(req_id, Reason.ALREADY_COMMITTED, message, resend.transaction_id))
                return
            message = (
                f"partition {self.partition_id}: sequence number {seq_num} is not after {resend.last_seq_num}, "
                f"the last one client {client_id} used here; sequence numbers strictly increase per client and "
                "partition: retry with a new one"
            )
            self._reject(stream, req_id, Reason.SEQUENCE_NOT_INCREASING, message)

        if self._pending.add_waiter(client_id, answer):
            answer()

    def _reject(self, stream: StreamPort, req_id: common_pb2.ReqId, reason: Reason.ValueType, message: str) -> None:
        stream.send_control(rejected(req_id, reason, message))
        if self.metrics is not None:
            self.metrics.appends["rejected"].inc()

    def _generation_message(self, generation: int) -> str:
        return (
            f"partition {self.partition_id} is at generation {self.generation}, the append carries {generation}: "
            "remount the partition"
        )
