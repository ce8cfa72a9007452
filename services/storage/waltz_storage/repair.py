"""A storage partition's damaged records: found (when a segment opens, by a read that fails its checks, by a scrub
step), reported, and rewritten with intact copies from another replica. Scrubbing's pacing is scrubber.py; the server
decides what to repair and from where (waltz_server.recovery, Repair)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

from waltz_common.types import Record
from waltz_storage.errors import InvalidRequest
from waltz_storage.segment import Segment

if TYPE_CHECKING:
    from waltz_storage.partition import PartitionSettings

SCRUB_STEP_RECORDS = 10_000  # records one scrub step checks at most

log = logging.getLogger(__name__)


class DamageRepair:
    """StoragePartition's damage finding, scrub steps and repair, over the state the partition keeps (declared
    here). Not thread-safe, like the partition: calls are serialised per partition."""

    partition_id: int
    settings: PartitionSettings
    _segments: list[Segment]
    damage_found: int

    @property
    def max_transaction_id(self) -> int:
        raise NotImplementedError

    def _check_open(self) -> None:
        raise NotImplementedError

    def _segment_for(self, transaction_id: int) -> Segment | None:
        raise NotImplementedError

    @property
    def damaged_transaction_ids(self) -> list[int]:
        """The ids of records held here that fail their checks (found at start, by a read or by scrubbing) and
        are not repaired yet, in order. They still count as held: max_transaction_id is not lowered for them."""
        return sorted(t for segment in self._segments for t in segment.damaged)

    @property
    def damaged_count(self) -> int:
        """How many records are damaged now (safe to read from another thread)."""
        return sum(len(segment.damaged) for segment in list(self._segments))

    def _found(self, segment: Segment, transaction_id: int, max_n: int, max_bytes: int) -> tuple[int, int, list[int]]:
        before = len(segment.damaged)
        result = segment.find_damage(transaction_id, max_n, max_bytes)
        self.damage_found += len(segment.damaged) - before
        return result

    def repair(self, records: Sequence[Record]) -> int:
        """Rewrite damaged records with intact copies from another replica (Segment.repair checks each against
        the record's own checksums); returns how many were repaired. InvalidRequest for a copy that does not
        fit, after the ones before it were repaired."""
        self._check_open()
        for record in records:
            segment = self._segment_for(record.transaction_id)
            if segment is None or record.transaction_id > self.max_transaction_id:
                raise InvalidRequest(
                    f"partition {self.partition_id}: transaction {record.transaction_id} is not held here"
                )
            segment.repair(record)
            log.warning(
                "partition %d: repaired damaged transaction %d from another replica's copy",
                self.partition_id,
                record.transaction_id,
            )
        return len(records)

    def scrub(self, transaction_id: int, max_bytes: int) -> tuple[int, int, list[int]]:
        """Check the records from transaction_id (about max_bytes of them) one by one: the next id to check (0
        after the end), the bytes read, and the damaged ids found."""
        self._check_open()
        if transaction_id > self.max_transaction_id:
            return 0, 0, []
        segment = self._segment_for(transaction_id)
        if segment is None:
            return 0, 0, []
        count, size, found = self._found(segment, transaction_id, SCRUB_STEP_RECORDS, max_bytes)
        if found:
            log.error("partition %d: scrubbing found damaged transactions %s", self.partition_id, found)
        following = transaction_id + max(count, 1)
        return (following if following <= self.max_transaction_id else 0), size, found

    def _note_read_damage(self, transaction_id: int, max_n: int) -> None:
        """A read failed its checks: find which records in its range are damaged, so they are reported."""
        txn = transaction_id
        while txn < transaction_id + max_n and txn <= self.max_transaction_id:
            segment = self._segment_for(txn)
            if segment is None:
                return
            count, _, _ = self._found(segment, txn, transaction_id + max_n - txn, self.settings.max_batch_bytes)
            if count == 0:
                return
            txn += count
