"""The WaltzStorageAdmin.Admin stream: cluster-key check, partition assignment, flags, listing, record reads."""

from __future__ import annotations

import logging
from typing import Any

import grpc

from waltz.v1 import storage_admin_pb2, storage_admin_pb2_grpc
from waltz_storage import protocol
from waltz_storage.codec import RecordFields
from waltz_storage.errors import InvalidRequest, StorageError
from waltz_storage.node import StorageNode, StreamReader

log = logging.getLogger(__name__)

# Records one digest request covers at most: it runs on the partition's thread, so it must not hold the
# partition's appends back for long (about 0.1 s per 10,000 small records on the development machine).
MAX_DIGEST_RECORDS = 10_000


def _success(seq_num: int) -> storage_admin_pb2.AdminResponse:
    return storage_admin_pb2.AdminResponse(success=storage_admin_pb2.AdminSuccessResponse(seq_num=seq_num))


def _failure(seq_num: int, exc: BaseException) -> storage_admin_pb2.AdminResponse:
    return storage_admin_pb2.AdminResponse(
        failure=storage_admin_pb2.AdminFailureResponse(seq_num=seq_num, exception=protocol.rpc_exception(exc))
    )


class AdminConnection:
    """One admin client: requests are served one at a time, in order."""

    def __init__(self, node: StorageNode, context: grpc.aio.ServicerContext) -> None:
        self.node = node
        self.context = context
        self.opened = False

    async def run(self) -> None:
        with StreamReader(self.context, self.node) as reader:
            while (request := await reader.read()) is not None:
                await self.context.write(await self._answer(request))

    async def _answer(self, request: storage_admin_pb2.AdminRequest) -> storage_admin_pb2.AdminResponse:
        kind = request.WhichOneof("request")
        if kind is None:
            return _failure(-1, InvalidRequest("the request carries no message (none of the oneof is set)"))
        msg = getattr(request, kind)
        try:
            if kind == "open":
                self.opened = False
                self.node.check_cluster(protocol.parse_cluster_key(msg.cluster_key), msg.num_partitions)
                self.opened = True
                return _success(msg.seq_num)
            if not self.opened:
                raise protocol.NotOpen("the admin stream is not open: send an Admin Open request with the cluster key")
            if kind != "partition_list":
                self.node.manager.control_file.check_partition_id(msg.partition_id)
            response: storage_admin_pb2.AdminResponse = await getattr(self, "_" + kind)(msg)
            return response
        except StorageError as e:
            log.warning("admin %s refused: %s", kind, e)
            self.node.metrics.request_failures.labels(protocol.Code.Name(protocol.error_code(e))).inc()  # type: ignore[arg-type]
            return _failure(msg.seq_num, e)
        except Exception as e:
            log.error("admin %s failed", kind, exc_info=e)
            return _failure(msg.seq_num, e)

    async def _partition_assignment(self, msg: Any) -> storage_admin_pb2.AdminResponse:
        pid = msg.partition_id
        if msg.toggled:
            await self.node.run(pid, self.node.manager.assign, pid)
            log.info("partition %d assigned", pid)
        else:
            await self.node.run(pid, self.node.manager.unassign, pid)
            log.info("partition %d unassigned; its files are deleted", pid)
        return _success(msg.seq_num)

    async def _partition_read(self, msg: Any) -> storage_admin_pb2.AdminResponse:
        await self.node.run(msg.partition_id, self.node.manager.set_readable, msg.partition_id, msg.toggled)
        log.info("partition %d readable=%s", msg.partition_id, msg.toggled)
        return _success(msg.seq_num)

    async def _partition_write(self, msg: Any) -> storage_admin_pb2.AdminResponse:
        await self.node.run(msg.partition_id, self.node.manager.set_writable, msg.partition_id, msg.toggled)
        log.info("partition %d writable=%s", msg.partition_id, msg.toggled)
        return _success(msg.seq_num)

    def _status(self, pid: int) -> storage_admin_pb2.PartitionStatus:
        status = storage_admin_pb2.PartitionStatus(
            partition_id=pid, assigned=True, session_id=-1, low_water_mark=-1, local_low_water_mark=-1
        )
        try:
            partition = self.node.manager.partition(pid)
            info = partition.last_session_info()
            status.readable = partition.readable
            status.writable = partition.writable
            status.session_id = info.session_id
            status.low_water_mark = info.low_water_mark
            status.local_low_water_mark = info.local_low_water_mark
            status.max_transaction_id = partition.max_transaction_id
            status.write_failure = self.node.executor.write_failures.get(pid)
            status.fence_session_id = partition.fence.highest_session_id
            status.committed_high_water_mark = partition.committed_high_water_mark
            status.damaged_transaction_ids.extend(partition.damaged_transaction_ids[:10_000])
        except StorageError as e:
            status.error = str(e) or type(e).__name__
            status.max_transaction_id = -1
        return status

    async def _partition_list(self, msg: Any) -> storage_admin_pb2.AdminResponse:
        statuses = [await self.node.run(pid, self._status, pid) for pid in self.node.manager.assigned_partitions()]
        return storage_admin_pb2.AdminResponse(
            partition_list=storage_admin_pb2.PartitionListResponse(seq_num=msg.seq_num, partitions=statuses)
        )

    async def _record_list(self, msg: Any) -> storage_admin_pb2.AdminResponse:
        def read() -> list[RecordFields]:
            partition = self.node.manager.partition(msg.partition_id)
            return self.node.executor.read_fields(partition, msg.transaction_id, msg.max_records)

        records = await self.node.run(msg.partition_id, read)
        response = storage_admin_pb2.AdminResponse()
        answer = response.record_list
        answer.seq_num = msg.seq_num
        answer.partition_id = msg.partition_id
        answer.record_list_length = len(records)
        protocol.add_records(answer.records, records)
        return response

    async def _fence_reset(self, msg: Any) -> storage_admin_pb2.AdminResponse:
        def reset() -> None:
            self.node.manager.partition(msg.partition_id).reset_fence(msg.session_id)

        await self.node.run(msg.partition_id, reset)
        return _success(msg.seq_num)

    async def _digest(self, msg: Any) -> storage_admin_pb2.AdminResponse:
        protocol.check_list_request(msg.transaction_id, msg.max_records)
        if msg.max_records < 1:
            raise InvalidRequest(f"a digest covers at least one record: max_records is {msg.max_records}")
        count = min(msg.max_records, MAX_DIGEST_RECORDS)

        def digest() -> storage_admin_pb2.PartitionDigestResponse:
            partition = self.node.manager.partition(msg.partition_id)
            partition.check_readable()
            covered, value = partition.digest(msg.transaction_id, count, self.node.limits.max_batch_bytes)
            return storage_admin_pb2.PartitionDigestResponse(
                seq_num=msg.seq_num,
                partition_id=msg.partition_id,
                transaction_id=msg.transaction_id,
                record_count=covered,
                digest=value,
                max_transaction_id=partition.max_transaction_id,
                low_water_mark=partition.last_session_info().low_water_mark,
            )

        return storage_admin_pb2.AdminResponse(digest=await self.node.run(msg.partition_id, digest))


class StorageAdminService(storage_admin_pb2_grpc.WaltzStorageAdminServicer):
    """grpc.aio servicer of WaltzStorageAdmin."""

    def __init__(self, node: StorageNode) -> None:
        self.node = node

    async def Admin(self, request_iterator: Any, context: grpc.aio.ServicerContext) -> None:
        await AdminConnection(self.node, context).run()
