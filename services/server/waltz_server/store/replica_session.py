"""ReplicaSession: one store session's requests to one replica, bound to one epoch of its node's stream."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from waltz.v1 import common_pb2, storage_pb2
from waltz_server.record_runs import Run, run_from_proto, run_from_records
from waltz_server.store.connection import Answer, StorageConnection, StorageConnectionLost, StorageError
from waltz_server.store.wire import append_request


@dataclass(frozen=True, slots=True)
class LastSessionInfo:
    session_id: int
    low_water_mark: int
    local_low_water_mark: int
    committed_high_water_mark: int = -1
    """The highest id the replica knows committed, below which it refuses a Truncate (-1: an older node)."""


class ReplicaSession:
    """Typed storage requests for (partition, session) on one connection epoch; errors are StorageError."""

    def __init__(self, connection: StorageConnection, epoch: int, partition_id: int, session_id: int) -> None:
        self.connection = connection
        self.replica = connection.connect_string
        self.epoch = epoch
        self.partition_id = partition_id
        self.session_id = session_id

    @property
    def alive(self) -> bool:
        return self.connection.epoch_alive(self.epoch)

    async def wait_lost(self) -> None:
        """Return when this session's stream ends, raising StorageConnectionLost (for a watching task)."""
        await self.connection.wait_lost(self.epoch)
        raise StorageConnectionLost(f"{self.replica}: connection lost")

    async def _call(self, request: storage_pb2.StorageRequest) -> storage_pb2.StorageResponse:
        return await self.connection.request(request, epoch=self.epoch)

    async def last_session_info(self) -> LastSessionInfo:
        r = await self._call(
            storage_pb2.StorageRequest(
                last_session_info=storage_pb2.LastSessionInfoRequest(
                    session_id=self.session_id, partition_id=self.partition_id
                )
            )
        )
        info = r.last_session_info
        committed = info.committed_high_water_mark if info.HasField("committed_high_water_mark") else -1
        return LastSessionInfo(info.last_session_id, info.low_water_mark, info.local_low_water_mark, committed)

    async def max_transaction_id(self) -> int:
        return (await self.max_transaction_id_and_damage())[0]

    async def max_transaction_id_and_damage(self) -> tuple[int, list[int]]:
        """The max transaction id and the ids of the damaged records the replica holds (not yet repaired)."""
        r = await self._call(
            storage_pb2.StorageRequest(
                max_transaction_id=storage_pb2.MaxTransactionIdRequest(
                    session_id=self.session_id, partition_id=self.partition_id
                )
            )
        )
        return r.max_transaction_id.transaction_id, list(r.max_transaction_id.damaged_transaction_ids)

    async def repair(self, records: Sequence[common_pb2.Record]) -> list[int]:
        """Rewrite damaged records with intact copies; the damaged ids left afterwards."""
        r = await self._call(
            storage_pb2.StorageRequest(
                repair=storage_pb2.RepairRequest(
                    session_id=self.session_id, partition_id=self.partition_id, records=records
                )
            )
        )
        return list(r.max_transaction_id.damaged_transaction_ids)

    async def truncate(self, transaction_id: int) -> int:
        """Drop everything above transaction_id; returns the max transaction id afterwards."""
        r = await self._call(
            storage_pb2.StorageRequest(
                truncate=storage_pb2.TruncateRequest(
                    transaction_id=transaction_id, session_id=self.session_id, partition_id=self.partition_id
                )
            )
        )
        return r.max_transaction_id.transaction_id

    async def set_low_water_mark(self, low_water_mark: int) -> None:
        await self._call(
            storage_pb2.StorageRequest(
                set_low_water_mark=storage_pb2.SetLowWaterMarkRequest(
                    low_water_mark=low_water_mark, session_id=self.session_id, partition_id=self.partition_id
                )
            )
        )

    async def append(self, records: Sequence[common_pb2.Record]) -> None:
        await self._call(append_request(self.session_id, self.partition_id, records))

    def send_append(self, request: storage_pb2.StorageRequest, serialized: bytes, answer: Answer) -> None:
        """Queue a prepared append shared by every replica (serialized: it with seq_num 0) without waiting; its
        answer calls back as it comes, and check_acknowledged() reads it. StorageConnectionLost at once when the
        stream is gone."""
        self.connection.send_answered(request, answer, epoch=self.epoch, serialized=serialized)

    def check_acknowledged(self, answered: Answer) -> None:
        """Whether the node acknowledged an append send_append() queued, once its answer came (the future is
        done): StorageError when it did not."""
        if answered.cancelled():
            raise StorageConnectionLost(f"{self.replica}: the append's answer was given up")
        self.connection.checked(answered.result())

    @property
    def request_timeout_s(self) -> float:
        """How long an answer may take (storage.requestTimeoutSeconds)."""
        return self.connection.request_timeout_s

    async def _record_list(self, transaction_id: int, max_records: int, raw: bool) -> storage_pb2.RecordListResponse:
        r = await self._call(
            storage_pb2.StorageRequest(
                record_list=storage_pb2.RecordListRequest(
                    transaction_id=transaction_id,
                    max_records=max_records,
                    session_id=self.session_id,
                    partition_id=self.partition_id,
                    raw=raw,
                )
            )
        )
        return r.record_list

    async def records(self, transaction_id: int, max_records: int) -> list[common_pb2.Record]:
        return list((await self._record_list(transaction_id, max_records, False)).records)

    async def record_run(self, transaction_id: int, max_records: int) -> Run:
        """The records as a run (a raw read): the node's RecordRun, or one built from its Record messages when it
        predates raw reads. StorageError when the answer does not add up (the next replica is asked then)."""
        answer = await self._record_list(transaction_id, max_records, True)
        try:
            if not answer.HasField("run"):
                return run_from_records(transaction_id, answer.records)
            run = run_from_proto(answer.run)
        except ValueError as e:
            raise StorageError(f"{self.replica}: a raw read answered {e}") from None
        if run.first != transaction_id or len(run) > max_records:
            raise StorageError(
                f"{self.replica}: a raw read answered {len(run)} records from {run.first} for {max_records} from "
                f"{transaction_id}"
            )
        return run

    async def headers(self, transaction_id: int, max_records: int) -> list[common_pb2.RecordHeader]:
        r = await self._call(
            storage_pb2.StorageRequest(
                record_header_list=storage_pb2.RecordHeaderListRequest(
                    transaction_id=transaction_id,
                    max_records=max_records,
                    session_id=self.session_id,
                    partition_id=self.partition_id,
                )
            )
        )
        return list(r.record_header_list.record_headers)
