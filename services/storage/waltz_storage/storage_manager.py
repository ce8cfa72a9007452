"""The storage directory: its locked control file and the partitions assigned to this node."""

from __future__ import annotations

import logging
import uuid
from pathlib import Path
from types import TracebackType

from waltz_storage.control_file import ControlFile
from waltz_storage.errors import PartitionNotAssigned, StorageError
from waltz_storage.partition import (
    DEFAULT_MAX_BATCH_BYTES,
    DEFAULT_MAX_RECORD_SIZE,
    DEFAULT_SEGMENT_CACHE_CAPACITY,
    DEFAULT_SEGMENT_SIZE_THRESHOLD,
    FLAGS_FILE_NAME,
    PartitionSettings,
    StoragePartition,
    remove_partition_files,
)

log = logging.getLogger(__name__)


class StorageManager:
    """Owns a storage directory; partitions that fail to open fail alone, on access. Not thread-safe."""

    def __init__(
        self,
        directory: Path | str,
        cluster_key: uuid.UUID,
        num_partitions: int,
        *,
        segment_size_threshold: int = DEFAULT_SEGMENT_SIZE_THRESHOLD,
        max_record_size: int = DEFAULT_MAX_RECORD_SIZE,
        max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES,
        segment_cache_capacity: int = DEFAULT_SEGMENT_CACHE_CAPACITY,
    ):
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.settings = PartitionSettings(
            segment_size_threshold, max_record_size, max_batch_bytes, segment_cache_capacity
        )
        self.control_file = ControlFile.open_or_create(self.directory, cluster_key, num_partitions)
        self._partitions: dict[int, StoragePartition] = {}
        self._failed: dict[int, StorageError] = {}
        for pid in range(num_partitions):
            if (self._partition_dir(pid) / FLAGS_FILE_NAME).exists():
                self._open(pid)

    @property
    def cluster_key(self) -> uuid.UUID:
        return self.control_file.cluster_key

    @property
    def num_partitions(self) -> int:
        return self.control_file.num_partitions

    def check_cluster(self, cluster_key: uuid.UUID, num_partitions: int) -> None:
        """Serve an Open request: ClusterKeyMismatch / PartitionCountMismatch unless both match."""
        self.control_file.check_cluster(cluster_key, num_partitions)

    def _partition_dir(self, partition_id: int) -> Path:
        return self.directory / str(partition_id)

    def _open(self, partition_id: int) -> None:
        try:
            self._partitions[partition_id] = StoragePartition.open(
                self._partition_dir(partition_id), partition_id, self.cluster_key, self.control_file, self.settings
            )
        except (StorageError, OSError) as e:
            log.error("partition %d cannot be opened: %s", partition_id, e)
            failure = e if isinstance(e, StorageError) else StorageError(f"partition {partition_id}: {e}")
            self._failed[partition_id] = failure

    def assigned_partitions(self) -> list[int]:
        """Ids of the partitions assigned here, including any that failed to open."""
        return sorted([*self._partitions, *self._failed])

    def open_partitions(self) -> list[tuple[int, StoragePartition]]:
        """The partitions assigned here and open, by id (safe to call from any thread)."""
        return sorted(self._partitions.items())

    def open_failures(self) -> dict[int, str]:
        """The assigned partitions that could not be opened, with why (safe to call from any thread)."""
        return {pid: str(e) or type(e).__name__ for pid, e in list(self._failed.items())}

    def is_assigned(self, partition_id: int) -> bool:
        return partition_id in self._partitions or partition_id in self._failed

    def partition(self, partition_id: int) -> StoragePartition:
        """The open partition; UnknownPartition, PartitionNotAssigned, or the error it failed to open with."""
        self.control_file.check_partition_id(partition_id)
        if partition_id in self._failed:
            failure = self._failed[partition_id]
            raise type(failure)(*failure.args)
        if partition_id not in self._partitions:
            raise PartitionNotAssigned(f"partition {partition_id} is not assigned to storage {self.directory}")
        return self._partitions[partition_id]

    def assign(self, partition_id: int) -> StoragePartition:
        """Create the partition's directory and files (no-op when already assigned)."""
        if self.is_assigned(partition_id):
            return self.partition(partition_id)
        self.control_file.check_partition_id(partition_id)
        partition = StoragePartition.create(
            self._partition_dir(partition_id), partition_id, self.cluster_key, self.control_file, self.settings
        )
        self._partitions[partition_id] = partition
        return partition

    def unassign(self, partition_id: int) -> None:
        """Delete the partition's files and reset its control-file structs (no-op when not assigned)."""
        self.control_file.check_partition_id(partition_id)
        partition = self._partitions.pop(partition_id, None)
        if partition is not None:
            partition.close()
        self._failed.pop(partition_id, None)
        remove_partition_files(self._partition_dir(partition_id))
        self.control_file.reset_partition_info(partition_id)

    def set_readable(self, partition_id: int, readable: bool) -> None:
        self.partition(partition_id).set_readable(readable)

    def set_writable(self, partition_id: int, writable: bool) -> None:
        self.partition(partition_id).set_writable(writable)

    def close(self) -> None:
        for partition in self._partitions.values():
            partition.close()
        self._partitions.clear()
        self.control_file.close()

    def __enter__(self) -> StorageManager:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
