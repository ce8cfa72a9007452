"""Small durable-file helpers: full positional reads and writes, directory fsync, atomic file creation."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path


def pwrite_all(fd: int, data: bytes | bytearray, offset: int) -> None:
    """Write all of data at offset, looping over short writes."""
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, offset)
        view = view[written:]
        offset += written


def pread_upto(fd: int, size: int, offset: int) -> bytes:
    """Read size bytes at offset, or fewer only if the file ends first."""
    chunks: list[bytes] = []
    while size > 0:
        chunk = os.pread(fd, size, offset)
        if not chunk:
            break
        chunks.append(chunk)
        size -= len(chunk)
        offset += len(chunk)
    return b"".join(chunks)


def fsync_dir(directory: Path) -> None:
    """Make entries created, renamed or removed in directory durable."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_tmp(path: Path, data: bytes) -> Path:
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        pwrite_all(fd, data, 0)
        os.fsync(fd)
    finally:
        os.close(fd)
    return tmp


def write_file_atomic(path: Path, data: bytes, *, sync_dir: bool = True) -> None:
    """Replace path with data so a crash leaves either the old or the new content."""
    tmp = _write_tmp(path, data)
    os.replace(tmp, path)
    if sync_dir:
        fsync_dir(path.parent)


def create_file_exclusive(path: Path, data: bytes) -> None:
    """Create path holding data, complete or not at all; FileExistsError if it exists."""
    tmp = _write_tmp(path, data)
    try:
        os.link(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    fsync_dir(path.parent)


def remove_stale_tmp_files(directory: Path) -> None:
    """Delete leftovers of interrupted atomic writes."""
    for tmp in directory.glob("*.tmp"):
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
