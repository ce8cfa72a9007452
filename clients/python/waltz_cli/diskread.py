"""Read-only parsing of a storage directory's files with the storage engine's codecs (no node, no locks, no repair)."""

from __future__ import annotations

import json
import mmap
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from waltz_common.types import Record
from waltz_storage.codec import (
    FILE_HEADER_SIZE,
    FORMAT_VERSION,
    INDEX_ENTRY_SIZE,
    ControlFileHeader,
    PartitionInfo,
    PartitionInfoStruct,
    SegmentFileHeader,
    control_file_size,
    decode_index_entries,
    decode_record,
    partition_info_offset,
)
from waltz_storage.control_file import CONTROL_FILE_NAME
from waltz_storage.errors import CorruptionError
from waltz_storage.partition import FLAGS_FILE_NAME
from waltz_storage.segment import DATA_SUFFIX, INDEX_SUFFIX


class DiskError(Exception):
    """A file cannot be read as what it should be; the message names it."""


@contextmanager
def mapped(path: Path) -> Iterator[bytes | mmap.mmap]:
    """The file's bytes, memory-mapped read-only (empty bytes for an empty file)."""
    try:
        with path.open("rb") as f:
            if path.stat().st_size == 0:
                yield b""
                return
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
                yield mm
    except FileNotFoundError:
        raise DiskError(f"{path} does not exist") from None
    except IsADirectoryError:
        raise DiskError(f"{path} is a directory") from None


@dataclass
class PartitionControl:
    """One partition's entry in the control file, and its directory's flags file if any."""

    partition_id: int
    slots: tuple[PartitionInfoStruct | None, PartitionInfoStruct | None] = (None, None)
    current: int | None = None
    error: str = ""
    flags: dict[str, Any] | None = None


@dataclass
class ControlDump:
    """A decoded control file."""

    path: Path
    header: ControlFileHeader
    partitions: list[PartitionControl]
    problems: list[str] = field(default_factory=list)


def control_path(path: Path) -> Path:
    """The control file itself, or the one inside a storage directory."""
    return path / CONTROL_FILE_NAME if path.is_dir() else path


def read_flags(directory: Path) -> dict[str, Any] | None:
    """A partition directory's flags file (it exists only while the partition is assigned)."""
    try:
        return dict(json.loads((directory / FLAGS_FILE_NAME).read_text()))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        return {"error": f"{FLAGS_FILE_NAME} unreadable: {exc}"}


def read_control(path: Path) -> ControlDump:
    """Decode the control file's header and every partition's two info structs."""
    path = control_path(path)
    with mapped(path) as buf:
        if len(buf) < FILE_HEADER_SIZE:
            raise DiskError(f"{path}: {len(buf)} bytes, too short for a control file header ({FILE_HEADER_SIZE})")
        header = ControlFileHeader.decode(bytes(buf[:FILE_HEADER_SIZE]))
        dump = ControlDump(path, header, [])
        if header.version != FORMAT_VERSION:
            dump.problems.append(f"unsupported format version {header.version}")
        expected = control_file_size(max(header.num_partitions, 0))
        if len(buf) != expected:
            dump.problems.append(f"file is {len(buf)} bytes, {header.num_partitions} partitions need {expected}")
        for pid in range(max(header.num_partitions, 0)):
            entry = PartitionControl(pid, flags=read_flags(path.parent / str(pid)))
            start = partition_info_offset(pid)
            try:
                info = PartitionInfo.decode(bytes(buf[start : start + 60]), pid)
                entry.slots = info.slots
                entry.current = info.current_slot()
            except CorruptionError as exc:
                entry.error = str(exc)
            dump.partitions.append(entry)
    return dump


@dataclass
class SegmentReport:
    """What a segment's files hold and what is wrong with them."""

    path: Path
    header: SegmentFileHeader | None = None
    records: int = 0
    first_transaction_id: int = -1
    valid_bytes: int = 0
    file_bytes: int = 0
    index_entries: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def last_transaction_id(self) -> int:
        return self.first_transaction_id + self.records - 1


def first_id_from_name(path: Path) -> int:
    """The first transaction id a segment's file name promises (%019d.seg)."""
    stem = path.name[: -len(DATA_SUFFIX)] if path.name.endswith(DATA_SUFFIX) else ""
    if len(stem) != 19 or not stem.isdigit():
        raise DiskError(f"{path}: not a segment data file name (expected 19 digits and {DATA_SUFFIX})")
    return int(stem)


def iter_records(
    buf: bytes | mmap.mmap, first_transaction_id: int, report: SegmentReport
) -> Iterator[tuple[int, Record]]:
    """(offset, record) for each intact record in order; a damaged one ends the scan with a problem."""
    offset, txn = FILE_HEADER_SIZE, first_transaction_id
    while offset < len(buf):
        try:
            record, end = decode_record(buf, offset, txn)  # type: ignore[arg-type]
        except CorruptionError as exc:
            report.problems.append(
                f"{exc}; the {len(buf) - offset} bytes from offset {offset} are not intact records "
                "(a storage node truncates them when it opens the segment)"
            )
            return
        yield offset, record
        report.records += 1
        report.valid_bytes = end
        offset, txn = end, txn + 1


def open_segment(path: Path, buf: bytes | mmap.mmap) -> SegmentReport:
    """Check the data file's header against its name and directory; the report before any record is read."""
    report = SegmentReport(path, file_bytes=len(buf), valid_bytes=min(len(buf), FILE_HEADER_SIZE))
    first = first_id_from_name(path)
    report.first_transaction_id = first
    if len(buf) < FILE_HEADER_SIZE:
        report.problems.append(f"header torn: {len(buf)} of {FILE_HEADER_SIZE} bytes")
        return report
    header = SegmentFileHeader.decode(bytes(buf[:FILE_HEADER_SIZE]))
    report.header = header
    if header.version != FORMAT_VERSION:
        report.problems.append(f"unsupported format version {header.version}")
    if header.first_transaction_id != first:
        report.problems.append(f"header says first transaction {header.first_transaction_id}, file name says {first}")
    if path.parent.name.isdigit() and header.partition_id != int(path.parent.name):
        report.problems.append(f"header names partition {header.partition_id}, directory is {path.parent.name}")
    control = path.parent.parent / CONTROL_FILE_NAME
    if control.exists():
        with mapped(control) as cbuf:
            if len(cbuf) >= FILE_HEADER_SIZE:
                key = ControlFileHeader.decode(bytes(cbuf[:FILE_HEADER_SIZE])).cluster_key
                if key != header.cluster_key:
                    report.problems.append(f"cluster key {header.cluster_key} differs from the control file's {key}")
    return report


def check_index(report: SegmentReport, offsets: list[int]) -> None:
    """Compare the .idx with the record offsets found by scanning the data file."""
    index_path = report.path.with_suffix(INDEX_SUFFIX)
    if not index_path.exists():
        report.problems.append(f"{index_path.name} is missing (a storage node rebuilds it on open)")
        return
    with mapped(index_path) as ibuf:
        if len(ibuf) < FILE_HEADER_SIZE or report.header is None:
            report.problems.append(f"{index_path.name}: header torn ({len(ibuf)} bytes)")
            return
        if SegmentFileHeader.decode(bytes(ibuf[:FILE_HEADER_SIZE])) != report.header:
            report.problems.append(f"{index_path.name}: header differs from the data file's")
        body = len(ibuf) - FILE_HEADER_SIZE
        if body % INDEX_ENTRY_SIZE:
            report.problems.append(f"{index_path.name}: a torn entry ({body % INDEX_ENTRY_SIZE} extra bytes)")
        count = body // INDEX_ENTRY_SIZE
        report.index_entries = count
        entries = decode_index_entries(bytes(ibuf[FILE_HEADER_SIZE : FILE_HEADER_SIZE + count * INDEX_ENTRY_SIZE]))
    if count != len(offsets):
        report.problems.append(f"{index_path.name}: {count} entries for {len(offsets)} records")
    wrong = [i for i, (a, b) in enumerate(zip(entries, offsets, strict=False)) if a != b]
    if wrong:
        txn = report.first_transaction_id + wrong[0]
        report.problems.append(
            f"{index_path.name}: {len(wrong)} entries point at the wrong offset (first: transaction {txn}, "
            f"index says {entries[wrong[0]]}, record is at {offsets[wrong[0]]})"
        )


def verify_segment(path: Path) -> SegmentReport:
    """Fully check one segment: header, every record's checksums and ids, and its index."""
    with mapped(path) as buf:
        report = open_segment(path, buf)
        if report.header is None:
            return report
        offsets = [offset for offset, _ in iter_records(buf, report.first_transaction_id, report)]
    check_index(report, offsets)
    return report


def segment_files(paths: list[Path]) -> list[Path]:
    """The .seg files named, or found below the directories named, in order."""
    found: list[Path] = []
    for path in paths:
        if path.is_dir():
            found.extend(sorted(path.rglob("*" + DATA_SUFFIX)))
        elif path.exists():
            found.append(path)
        else:
            raise DiskError(f"{path} does not exist")
    return found
