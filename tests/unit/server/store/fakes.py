"""In-memory storage replicas behind fake connections, to drive StoreSession without sockets or files."""

from __future__ import annotations

import asyncio
from itertools import accumulate
from typing import Any, cast

from waltz.v1 import common_pb2, storage_pb2
from waltz_common.types import crc32
from waltz_common.wire import record_from_proto, record_to_proto
from waltz_server.store.connection import (
    Answer,
    Code,
    StorageConnectionLost,
    StorageRpcError,
    seq_num_patch,
)
from waltz_server.store.connections import StorageConnections
from waltz_server.store.wire import request_body
from waltz_storage.codec import encode_record, join_spans
from waltz_storage.protocol import records_from_append


def record(transaction_id: int, tag: str = "r") -> common_pb2.Record:
    data = f"{tag}{transaction_id}".encode()
    return common_pb2.Record(
        transaction_id=transaction_id,
        req_id=common_pb2.ReqId(client_id=1, generation=1, partition_id=0, seq_num=transaction_id),
        header=0,
        data_length=len(data),
        data=data,
        checksum=crc32(data),
    )


class FakeReplica:
    """One storage partition: its records, last session info and session fence."""

    def __init__(self, max_transaction_id: int = -1, session_id: int = -1, low_water_mark: int = -1, tag: str = "r"):
        self.records = [record(i, tag) for i in range(max_transaction_id + 1)]
        self.session_id = session_id
        self.low_water_mark = low_water_mark
        self.fence = session_id
        self.hold_appends = False  # appends wait (unanswered) while True
        self.released = asyncio.Event()
        self.fail_reads = False
        self.max_list = 10_000  # a storage node answers long lists in parts
        self.corrupt_reads = False  # reads are answered CORRUPTED, as a node whose data file rotted answers them
        self.damaged: list[int] = []  # what it reports damaged (max_transaction_id)
        self.ignores_raw = False  # answers raw reads with records, as a node that predates them does

    @property
    def max_transaction_id(self) -> int:
        return len(self.records) - 1

    async def handle(self, kind: str, msg: Any) -> storage_pb2.StorageResponse:
        if msg.session_id < self.fence:
            raise StorageRpcError(Code.STALE_SESSION, f"stale session {msg.session_id} < {self.fence}")
        self.fence = msg.session_id
        if kind == "last_session_info":
            info = storage_pb2.LastSessionInfoResponse(
                last_session_id=self.session_id, low_water_mark=self.low_water_mark, local_low_water_mark=-1
            )
            return storage_pb2.StorageResponse(last_session_info=info)
        if kind in ("max_transaction_id", "truncate"):
            if kind == "truncate":
                del self.records[msg.transaction_id + 1 :]
            answer = storage_pb2.MaxTransactionIdResponse(
                transaction_id=self.max_transaction_id, damaged_transaction_ids=self.damaged
            )
            return storage_pb2.StorageResponse(max_transaction_id=answer)
        if kind == "set_low_water_mark":
            if self.max_transaction_id > msg.low_water_mark:
                raise StorageRpcError(Code.INVALID_REQUEST, "dirty data above the low-water mark")
            self.session_id, self.low_water_mark = msg.session_id, msg.low_water_mark
            return storage_pb2.StorageResponse(success=storage_pb2.SuccessResponse())
        if kind == "append":
            while self.hold_appends:
                self.released.clear()
                await self.released.wait()
            for r in map(record_to_proto, records_from_append(msg)):  # as a storage node reads them
                if r.transaction_id != self.max_transaction_id + 1:
                    raise StorageRpcError(Code.INVALID_REQUEST, f"non-consecutive {r.transaction_id}")
                copy = common_pb2.Record()
                copy.CopyFrom(r)
                self.records.append(copy)
            return storage_pb2.StorageResponse(success=storage_pb2.SuccessResponse())
        if self.fail_reads:
            raise StorageRpcError(Code.IO_ERROR, "read failed")
        if self.corrupt_reads:
            raise StorageRpcError(Code.CORRUPTED, "record at offset 128: record checksum 1 does not match computed 2")
        found = self.records[msg.transaction_id : msg.transaction_id + min(msg.max_records, self.max_list)]
        if kind == "record_list" and msg.raw and not self.ignores_raw:
            return storage_pb2.StorageResponse(record_list=raw_answer(msg.transaction_id, found))
        if kind == "record_list":
            return storage_pb2.StorageResponse(record_list=storage_pb2.RecordListResponse(records=found))
        headers = [common_pb2.RecordHeader(transaction_id=r.transaction_id, req_id=r.req_id) for r in found]
        return storage_pb2.StorageResponse(
            record_header_list=storage_pb2.RecordHeaderListResponse(record_headers=headers)
        )

    def release(self) -> None:
        self.hold_appends = False
        self.released.set()


def raw_answer(first: int, records: list[common_pb2.Record]) -> storage_pb2.RecordListResponse:
    """The answer a storage node gives a raw read of records (its own encoder and join_spans)."""
    blobs = [encode_record(record_from_proto(r)) for r in records]
    offsets = list(accumulate((len(b) for b in blobs), initial=0))
    data, ends = join_spans([(b"".join(blobs), offsets)])
    run = common_pb2.RecordRun(first_transaction_id=first, count=len(records), records=data, ends=ends)
    return storage_pb2.RecordListResponse(record_list_length=len(records), run=run)


class FakeConnection:
    """The StorageConnection surface StoreSession uses; down() loses the stream, up() opens a new epoch."""

    def __init__(self, connect_string: str, replica: FakeReplica, online: bool = True) -> None:
        self.connect_string = connect_string
        self.replica = replica
        self.epoch = 1 if online else 0
        self.online = online
        self._changed = asyncio.Event()
        self._pending: set[asyncio.Task[Any]] = set()
        self.next_seq = 0

    @property
    def connected(self) -> bool:
        return self.online

    def epoch_alive(self, epoch: int) -> bool:
        return self.online and epoch == self.epoch

    async def wait_connected(self) -> int:
        while not self.online:
            self._changed.clear()
            await self._changed.wait()
        return self.epoch

    async def wait_lost(self, epoch: int) -> None:
        while self.epoch_alive(epoch):
            self._changed.clear()
            await self._changed.wait()

    def down(self) -> None:
        self.online = False
        for work in self._pending:
            work.cancel()
        self._changed.set()

    def up(self) -> None:
        self.online = True
        self.epoch += 1
        self._changed.set()

    async def request(
        self,
        message: storage_pb2.StorageRequest,
        *,
        epoch: int | None = None,
        timeout: float | None = None,
        serialized: bytes | None = None,
    ) -> storage_pb2.StorageResponse:
        return await self.answer(self.send(message, epoch=epoch, serialized=serialized), timeout)

    def send(
        self, message: storage_pb2.StorageRequest, *, epoch: int | None = None, serialized: bytes | None = None
    ) -> asyncio.Future[storage_pb2.StorageResponse]:
        if not self.online or (epoch is not None and epoch != self.epoch):
            raise StorageConnectionLost(f"{self.connect_string}: not connected")
        if serialized is not None:  # what the node would parse
            self.next_seq += 1
            message = storage_pb2.StorageRequest.FromString(serialized + seq_num_patch(message, self.next_seq))
        kind = message.WhichOneof("request")
        msg = request_body(message)
        work = asyncio.ensure_future(self.replica.handle(kind or "", msg))
        self._pending.add(work)
        work.add_done_callback(self._pending.discard)
        return work

    def send_answered(self, message: storage_pb2.StorageRequest, answer: Answer, *, epoch: int | None = None,
                      serialized: bytes | None = None) -> None:
        def answered(work: asyncio.Future[storage_pb2.StorageResponse]) -> None:
            if work.cancelled():
                answer.set_exception(StorageConnectionLost(f"{self.connect_string}: request cancelled"))
            elif work.exception() is not None:
                answer.set_exception(work.exception())  # type: ignore[arg-type]
            else:
                answer.set_result(work.result())

        self.send(message, epoch=epoch, serialized=serialized).add_done_callback(answered)

    request_timeout_s = 20.0

    def checked(self, response: storage_pb2.StorageResponse) -> storage_pb2.StorageResponse:
        return response  # the fake replica raises its refusals (handle), it answers no Failure

    async def answer(
        self, sent: asyncio.Future[storage_pb2.StorageResponse], timeout: float | None = None
    ) -> storage_pb2.StorageResponse:
        try:
            return await sent
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                raise
            raise StorageConnectionLost(f"{self.connect_string}: lost") from None


class FakeConnections:
    def __init__(self, replicas: dict[str, FakeReplica], offline: tuple[str, ...] = ()) -> None:
        self.connections = {name: FakeConnection(name, r, name not in offline) for name, r in replicas.items()}
        self.users: dict[str, int] = {}  # get() minus release() by connect string

    def get(self, connect_string: str) -> FakeConnection:
        self.users[connect_string] = self.users.get(connect_string, 0) + 1
        return self.connections[connect_string]

    def release(self, connect_string: str) -> None:
        self.users[connect_string] -= 1

    def is_connected(self, connect_string: str) -> bool:
        return self.connections[connect_string].online

    def as_pool(self) -> StorageConnections:
        return cast(StorageConnections, self)
