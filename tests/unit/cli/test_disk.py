"""`waltz disk` on files written by the real storage engine, intact and damaged."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from tests.unit.cli.helpers import waltz
from waltz_common.types import Record, ReqId, crc32
from waltz_storage.codec import FILE_HEADER_SIZE
from waltz_storage.storage_manager import StorageManager

KEY = uuid.UUID("12345678-1234-5678-1234-567812345678")


def _records(pid: int, first: int, count: int) -> list[Record]:
    out = []
    for txn in range(first, first + count):
        data = f"txn-{txn}".encode()
        out.append(Record(txn, ReqId(7, 1, pid, txn), txn % 5, data, crc32(data)))
    return out


@pytest.fixture
def storage(tmp_path: Path) -> Path:
    """A storage directory of 3 partitions: 0 holds 30 records over several segments, 1 is empty, 2 unassigned."""
    directory = tmp_path / "storage"
    with StorageManager(directory, KEY, 3, segment_size_threshold=400) as manager:
        p0 = manager.assign(0)
        for first in range(0, 30, 5):
            p0.append(_records(0, first, 5))
        p0.set_low_water_mark(3, 29)
        manager.assign(1)
        manager.set_writable(1, False)
    return directory


def _segments(storage: Path, pid: int = 0) -> list[Path]:
    return sorted((storage / str(pid)).glob("*.seg"))


def test_dump_control(capsys, storage):
    run = waltz(capsys, "disk", "dump-control", str(storage), "--json")
    assert run.code == 0, run.err
    data = run.json()
    assert data["cluster_key"] == str(KEY) and data["num_partitions"] == 3 and data["problems"] == []
    by_pid = {p["partition"]: p for p in data["partitions"]}
    current = by_pid[0]["slots"][by_pid[0]["current_slot"]]
    assert current == {"session_id": 3, "low_water_mark": 29, "local_low_water_mark": 29}
    assert by_pid[1]["flags"]["writable"] is False and by_pid[1]["assigned"]
    assert not by_pid[2]["assigned"]
    human = waltz(capsys, "disk", "dump-control", str(storage / "waltz-storage.ctl"), "-a")
    assert human.code == 0 and str(KEY) in human.out
    rows = [line.split() for line in human.out.splitlines()[3:]]
    assert [r[0] for r in rows] == ["0", "1"]
    assert rows[0][:7] == ["0", "yes", "yes", "yes", "3", "29", "29"]


def test_dump_control_with_a_corrupt_slot(capsys, storage):
    ctl = storage / "waltz-storage.ctl"
    raw = bytearray(ctl.read_bytes())
    raw[FILE_HEADER_SIZE + 4 + 3] ^= 0xFF  # partition 0, slot 0
    raw[FILE_HEADER_SIZE + 4 + 28 + 3] ^= 0xFF  # partition 0, slot 1
    ctl.write_bytes(bytes(raw))
    data = waltz(capsys, "disk", "dump-control", str(storage), "--json", "-p", "0").json()
    assert [p["partition"] for p in data["partitions"]] == [0]
    assert "both structs fail their checksum" in data["partitions"][0]["error"]


def test_dump_segment(capsys, storage):
    segments = _segments(storage)
    assert len(segments) > 1, "the fixture should roll segments"
    run = waltz(capsys, "disk", "dump-segment", str(segments[1]), "--json", "--data")
    assert run.code == 0, run.err
    data = run.json()
    first = data["header"]["first_transaction_id"]
    assert first > 0 and data["header"]["partition_id"] == 0
    assert [r["transaction_id"] for r in data["records"]] == list(range(first, first + data["records_in_file"]))
    assert data["records"][0]["data"] == f"txn-{first}"
    assert data["records"][0]["client_id"] == 7
    some = waltz(capsys, "disk", "dump-segment", str(segments[0]), "-t", "2", "-n", "2")
    assert some.code == 0
    assert [line.split()[0] for line in some.out.splitlines()[3:]] == ["2", "3"]


def test_verify_segment_on_intact_files(capsys, storage):
    run = waltz(capsys, "disk", "verify-segment", str(storage), "--json")
    assert run.code == 0, run.out
    data = run.json()
    assert data["ok"]
    assert sum(s["records"] for s in data["segments"]) == 30
    assert waltz(capsys, "disk", "verify-segment", str(_segments(storage)[0])).out.rstrip().endswith("OK")


def test_verify_segment_finds_a_flipped_bit(capsys, storage):
    seg = _segments(storage)[0]
    raw = bytearray(seg.read_bytes())
    raw[FILE_HEADER_SIZE + 40] ^= 0x01  # inside record 0's data
    seg.write_bytes(bytes(raw))
    run = waltz(capsys, "disk", "verify-segment", str(seg), "--json")
    assert run.code == 1
    (report,) = run.json()["segments"]
    assert report["records"] == 0
    assert any("checksum" in p for p in report["problems"])
    assert "PROBLEMS FOUND" in waltz(capsys, "disk", "verify-segment", str(seg)).out


def test_verify_segment_finds_a_torn_tail_and_a_stale_index(capsys, storage):
    seg = _segments(storage)[-1]
    size = seg.stat().st_size
    with seg.open("r+b") as f:
        f.truncate(size - 3)
    (report,) = waltz(capsys, "disk", "verify-segment", str(seg), "--json").json()["segments"]
    problems = " | ".join(report["problems"])
    assert "bytes from offset" in problems and "entries for" in problems
    idx = seg.with_suffix(".idx")
    idx.unlink()
    (report,) = waltz(capsys, "disk", "verify-segment", str(seg), "--json").json()["segments"]
    assert any(".idx is missing" in p for p in report["problems"])


def test_verify_segment_finds_a_misplaced_segment(capsys, storage, tmp_path):
    seg = _segments(storage)[1]
    renamed = seg.with_name(f"{int(seg.stem) + 1:019d}.seg")
    renamed.write_bytes(seg.read_bytes())
    (report,) = waltz(capsys, "disk", "verify-segment", str(renamed), "--json").json()["segments"]
    assert any("file name says" in p for p in report["problems"])


def test_disk_errors_are_one_line(capsys, tmp_path):
    for argv in (
        ["disk", "dump-control", str(tmp_path / "missing")],
        ["disk", "dump-segment", str(tmp_path / "x.seg")],
        ["disk", "verify-segment", str(tmp_path)],
    ):
        run = waltz(capsys, *argv)
        assert run.code == 1 and len(run.err.strip().splitlines()) == 1 and "Traceback" not in run.err, argv
    bad_name = tmp_path / "notasegment.seg"
    bad_name.write_bytes(b"x" * 200)
    run = waltz(capsys, "disk", "dump-segment", str(bad_name))
    assert run.code == 1 and "not a segment data file name" in run.err


def test_disk_commands_never_modify_files(capsys, storage):
    before = {p: p.read_bytes() for p in storage.rglob("*") if p.is_file()}
    seg = _segments(storage)[-1]
    with seg.open("r+b") as f:
        f.truncate(seg.stat().st_size - 3)
    before[seg] = seg.read_bytes()
    waltz(capsys, "disk", "verify-segment", str(storage))
    waltz(capsys, "disk", "dump-segment", str(seg))
    waltz(capsys, "disk", "dump-control", str(storage))
    assert {p: p.read_bytes() for p in storage.rglob("*") if p.is_file()} == before
