"""The locked control file waltz-storage.ctl: header check and per-partition dual-slot session info."""

from __future__ import annotations

import fcntl
import logging
import os
import time
import uuid
from pathlib import Path

from waltz_storage.codec import (
    FILE_HEADER_SIZE,
    FORMAT_VERSION,
    PARTITION_INFO_STRUCT_SIZE,
    ControlFileHeader,
    PartitionInfo,
    PartitionInfoStruct,
    control_file_size,
    partition_info_offset,
    partition_info_struct_offset,
)
from waltz_storage.errors import (
    CorruptionError,
    InvalidRequest,
    StaleSession,
    StorageDirectoryInUse,
    StorageError,
    UnknownPartition,
)
from waltz_storage.fileutil import create_file_exclusive, pread_upto, pwrite_all

CONTROL_FILE_NAME = "waltz-storage.ctl"

log = logging.getLogger(__name__)


class ControlFile:
    """An open, exclusively locked control file; not thread-safe."""

    def __init__(self, path: Path, fd: int, header: ControlFileHeader, infos: list[PartitionInfo | StorageError]):
        self.path = path
        self.header = header
        self._fd: int | None = fd
        self._infos = infos

    @classmethod
    def create(cls, directory: Path, cluster_key: uuid.UUID, num_partitions: int) -> ControlFile:
        """Write a new control file with fresh partition infos, then open it; fails if one exists."""
        if num_partitions <= 0:
            raise InvalidRequest(f"number of partitions must be positive, got {num_partitions}")
        header = ControlFileHeader(FORMAT_VERSION, time.time_ns() // 1_000_000, cluster_key, num_partitions)
        body = b"".join(PartitionInfo.fresh(pid).encode() for pid in range(num_partitions))
        path = Path(directory) / CONTROL_FILE_NAME
        try:
            create_file_exclusive(path, header.encode() + body)
        except FileExistsError:
            raise StorageError(f"control file {path} already exists") from None
        return cls.open(directory, cluster_key, num_partitions)

    @classmethod
    def open(cls, directory: Path, cluster_key: uuid.UUID, num_partitions: int) -> ControlFile:
        """Lock and read an existing control file, refusing another cluster key or partition count."""
        path = Path(directory) / CONTROL_FILE_NAME
        try:
            fd = os.open(path, os.O_RDWR)
        except FileNotFoundError:
            raise StorageError(f"control file {path} does not exist") from None
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise StorageDirectoryInUse(f"storage directory {directory} is already in use") from None
            header_bytes = pread_upto(fd, FILE_HEADER_SIZE, 0)
            if len(header_bytes) < FILE_HEADER_SIZE:
                raise CorruptionError(f"control file {path}: header is {len(header_bytes)} bytes, needs 128")
            header = ControlFileHeader.decode(header_bytes)
            header.check(cluster_key, num_partitions, f"control file {path}")
            expected = control_file_size(num_partitions)
            body = pread_upto(fd, expected - FILE_HEADER_SIZE, FILE_HEADER_SIZE)
            if FILE_HEADER_SIZE + len(body) < expected:
                raise CorruptionError(
                    f"control file {path} is {FILE_HEADER_SIZE + len(body)} bytes, expected {expected}"
                )
            infos = [cls._decode_info(body, pid) for pid in range(num_partitions)]
        except BaseException:
            os.close(fd)
            raise
        return cls(path, fd, header, infos)

    @classmethod
    def open_or_create(cls, directory: Path, cluster_key: uuid.UUID, num_partitions: int) -> ControlFile:
        if (Path(directory) / CONTROL_FILE_NAME).exists():
            return cls.open(directory, cluster_key, num_partitions)
        return cls.create(directory, cluster_key, num_partitions)

    @staticmethod
    def _decode_info(body: bytes, pid: int) -> PartitionInfo | StorageError:
        start = partition_info_offset(pid) - FILE_HEADER_SIZE
        try:
            info = PartitionInfo.decode(body[start:], pid)
            info.current_slot()
        except StorageError as e:
            log.error("%s", e)
            return e
        if None in info.slots:
            log.warning("partition %d: one partition info struct fails its checksum; using the other", pid)
        return info

    @property
    def cluster_key(self) -> uuid.UUID:
        return self.header.cluster_key

    @property
    def num_partitions(self) -> int:
        return self.header.num_partitions

    def check_cluster(self, cluster_key: uuid.UUID, num_partitions: int) -> None:
        """Raise ClusterKeyMismatch / PartitionCountMismatch unless both match (an Open request)."""
        self.header.check(cluster_key, num_partitions, f"control file {self.path}")

    def check_partition_id(self, partition_id: int) -> None:
        """Raise UnknownPartition unless 0 <= partition_id < number of partitions."""
        if not 0 <= partition_id < self.num_partitions:
            raise UnknownPartition(
                f"partition {partition_id} does not exist (partitions are 0..{self.num_partitions - 1})"
            )

    def _info(self, partition_id: int) -> PartitionInfo:
        self.check_partition_id(partition_id)
        info = self._infos[partition_id]
        if isinstance(info, StorageError):
            raise info
        return info

    def partition_info(self, partition_id: int) -> PartitionInfoStruct:
        """The current struct; PartitionInfoCorrupted if both slots are bad."""
        return self._info(partition_id).current

    def set_partition_info(self, partition_id: int, info: PartitionInfoStruct) -> None:
        """Durably write info into the non-current slot; it may not be older than the current one."""
        old = self._info(partition_id)
        current = old.current
        if info.session_id < current.session_id:
            raise StaleSession(
                f"stale session {info.session_id}, partition {partition_id} is at session {current.session_id}"
            )
        if info < current:
            raise InvalidRequest(f"partition {partition_id}: {info} would be older than the current {current}")
        slot, new = old.updated(info)
        offset = partition_info_struct_offset(partition_id, slot)
        encoded = info.encode()
        assert len(encoded) == PARTITION_INFO_STRUCT_SIZE
        pwrite_all(self._require_fd(), encoded, offset)
        os.fsync(self._require_fd())
        self._infos[partition_id] = new

    def overwrite_partition_info(self, partition_id: int, info: PartitionInfoStruct) -> None:
        """Durably write info into both slots, even if it is older than the current one: only for an operator
        clearing a poisoned session fence (StoragePartition.reset_fence). A write torn across the two slots
        leaves one of them failing its checksum and the other holding the old or the new info."""
        self.check_partition_id(partition_id)
        both = PartitionInfo(partition_id, (info, info))
        pwrite_all(self._require_fd(), both.encode(), partition_info_offset(partition_id))
        os.fsync(self._require_fd())
        self._infos[partition_id] = both

    def reset_partition_info(self, partition_id: int) -> None:
        """Durably overwrite both slots with fresh (-1, -1, -1) structs (unassign, or repair)."""
        self.check_partition_id(partition_id)
        fresh = PartitionInfo.fresh(partition_id)
        pwrite_all(self._require_fd(), fresh.encode(), partition_info_offset(partition_id))
        os.fsync(self._require_fd())
        self._infos[partition_id] = fresh

    def _require_fd(self) -> int:
        if self._fd is None:
            raise StorageError(f"control file {self.path} is closed")
        return self._fd

    def close(self) -> None:
        """Release the lock and the file."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
