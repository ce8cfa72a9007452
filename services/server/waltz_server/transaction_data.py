"""Transaction data reads: single records (cache, then store) and closed ranges for bulk readers."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence, Sized
from itertools import accumulate
from typing import NamedTuple, TypeVar

from waltz.v1 import common_pb2, server_pb2
from waltz_common.record_layout import RECORD_OVERHEAD
from waltz_server.partition import Partition
from waltz_server.record_runs import Run, pieces, split_run
from waltz_server.store.api import StoreUnavailable


class RangeError(ValueError):
    """A requested range or transaction id the partition cannot serve; `missing` if it is above the log."""

    def __init__(self, message: str, missing: bool = False) -> None:
        super().__init__(message)
        self.missing = missing


async def transaction_data(
    partition: Partition, request: server_pb2.TransactionDataRequest
) -> server_pb2.TransactionDataResponse:
    """The Transaction Data Response: the record, or success=false with why not."""
    txn = request.transaction_id
    answer = server_pb2.TransactionDataResponse(req_id=request.req_id, transaction_id=txn)
    hwm = partition.high_water_mark
    if txn < 0 or txn > hwm:
        answer.error_message = (
            f"transaction {txn} does not exist in partition {partition.partition_id} (high-water mark {hwm})"
        )
        return answer
    record = partition.data_cache.get(txn)
    if record is None:
        record = await partition.store.get_record(txn)
        if record is None:
            answer.error_message = f"transaction {txn} of partition {partition.partition_id} could not be read"
            return answer
        partition.data_cache.put(txn, record, len(record.data))
    answer.success = True
    answer.data_length = len(record.data)
    answer.data = record.data
    answer.checksum = record.checksum
    return answer


def check_range(first: int, last: int, high_water_mark: int, partition_id: int) -> None:
    """RangeError unless [first, last] is a non-empty range of committed transactions."""
    if first < 0 or last < first:
        raise RangeError(f"bad range [{first}, {last}]: need 0 <= from_transaction_id <= to_transaction_id")
    if last > high_water_mark:
        raise RangeError(
            f"transaction {last} does not exist in partition {partition_id} (high-water mark {high_water_mark})",
            missing=True,
        )


def batch_size(requested: int, limit: int) -> int:
    """Records per response: the requested number within 1..limit (0: the limit)."""
    return limit if requested <= 0 else min(requested, limit)


READ_AHEAD = 2
"""Store reads a range keeps in flight beyond the one at hand, so the storage node reads the next records
while the server and the client handle these."""
STORE_READ_BATCH = 2000
"""Records asked of the store at once (at least the message size): fewer, larger storage requests."""

P = TypeVar("P", bound=Sized)
M = TypeVar("M")


class _Plan(NamedTuple):
    """A range's reads: [first, last] in messages of size records, the store read store_batch records at a time,
    read_ahead reads ahead."""

    first: int
    last: int
    size: int
    read_ahead: int = READ_AHEAD
    store_batch: int = STORE_READ_BATCH


async def read_range(
    partition: Partition,
    first: int,
    last: int,
    size: int,
    read_ahead: int = READ_AHEAD,
    store_batch: int = STORE_READ_BATCH,
    max_bytes: int | None = None,
) -> AsyncIterator[Sequence[common_pb2.Record]]:
    """The committed records [first, last], in order, in lists of at most size records and max_bytes bytes (data and
    each record's overhead in the data file; at least one record each) from the store's messages."""
    plan = _Plan(first, last, size, read_ahead, store_batch)
    async for records in _planned_reads(partition, plan, partition.store.get_records, check_dense):
        sizes = (len(r.data) + RECORD_OVERHEAD for r in records)
        ends = list(accumulate(sizes)) if max_bytes is not None else range(1, len(records) + 1)
        for start, stop in pieces(ends, size, max_bytes):
            yield records[start:stop]


async def read_runs(
    partition: Partition, first: int, last: int, size: int, max_bytes: int | None = None, **plan: int
) -> AsyncIterator[Run]:
    """read_range's records as runs of at most size records and max_bytes bytes (a raw read: the store's runs split,
    none decoded); plan: read_range's read_ahead and store_batch."""
    async for run in _planned_reads(partition, _Plan(first, last, size, **plan), partition.store.get_run, check_run):
        for piece in split_run(run, size, max_bytes):
            yield piece


async def _planned_reads(
    partition: Partition,
    plan: _Plan,
    fetch: Callable[[int, int], Awaitable[P]],
    check: Callable[[P, int, int], None],
) -> AsyncIterator[P]:
    """The store's answers for [first, last] in order, each checked (check(answer, first id, most ids)), read
    read_ahead answers ahead of the one at hand and store_batch (at least size) records at a time."""
    first, last, size, read_ahead, store_batch = plan
    check_range(first, last, partition.high_water_mark, partition.partition_id)
    count_of = max(size, store_batch)
    planned: deque[asyncio.Future[P]] = deque()  # reads of consecutive runs from next_id on
    planned_to = next_id = first  # planned_to: the first id no planned read asks for
    try:
        while next_id <= last:
            while len(planned) <= read_ahead and planned_to <= last:
                count = min(count_of, last - planned_to + 1)
                planned.append(asyncio.ensure_future(fetch(planned_to, count)))
                planned_to += count
            answer = await planned.popleft()
            count = min(count_of, last - next_id + 1)
            if not answer:
                raise StoreUnavailable(f"the store returned nothing from transaction {next_id}")
            check(answer, next_id, count)
            next_id += len(answer)
            if len(answer) < count:  # a short answer: the reads planned after it start too far on
                _cancel(planned)
                planned_to = next_id
            yield answer
    finally:
        _cancel(planned)


def _cancel(planned: deque[asyncio.Future[M]]) -> None:
    while planned:
        read = planned.popleft()
        if read.done() and not read.cancelled():
            read.exception()  # retrieved: the failure of a read nobody waits for any more is no news
        read.cancel()


def check_dense(records: Sequence[common_pb2.Record], first: int, count: int) -> None:
    """StoreUnavailable unless records are at most count consecutive transactions from first."""
    ids = [r.transaction_id for r in records]
    if len(ids) > count or ids != list(range(first, first + len(ids))):
        raise StoreUnavailable(
            f"the store answered transactions {ids[0]}..{ids[-1]} ({len(ids)}) for {count} from {first}"
        )


def check_run(run: Run, first: int, count: int) -> None:
    """check_dense for a run: it starts at first and holds at most count (its records follow one another)."""
    if run.first != first or len(run) > count:
        raise StoreUnavailable(
            f"the store answered transactions {run.first}..{run.last} ({len(run)}) for {count} from {first}"
        )
