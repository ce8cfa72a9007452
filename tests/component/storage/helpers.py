"""Shared helpers of the storage engine component tests."""

import uuid
from pathlib import Path

from waltz_common.types import Record, ReqId, crc32
from waltz_storage.storage_manager import StorageManager

KEY = uuid.UUID("0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0")


def make_record(txn: int, size: int = 20) -> Record:
    data = bytes((txn * 7 + i) % 251 for i in range(size))
    return Record(txn, ReqId(11, 2, 0, txn), txn % 5, data, crc32(data))


def make_records(start: int, n: int, size: int = 20) -> list[Record]:
    return [make_record(t, size) for t in range(start, start + n)]


def open_manager(directory: Path, num_partitions: int = 2, **kwargs: int) -> StorageManager:
    return StorageManager(directory, KEY, num_partitions, **kwargs)


def snapshot(directory: Path) -> dict[Path, bytes]:
    """Every file below directory with its bytes."""
    return {p: p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def restore(files: dict[Path, bytes]) -> None:
    for path, data in files.items():
        path.write_bytes(data)
