"""A reader written from the seed's on-disk tables alone (struct + zlib) finds exactly what was appended."""

import struct
import zlib
from pathlib import Path

from tests.component.storage.helpers import KEY, make_records, open_manager


def crc(data: bytes) -> int:
    return struct.unpack(">i", struct.pack(">I", zlib.crc32(data)))[0]


def read_control_file(path: Path) -> dict:
    raw = path.read_bytes()
    version, created, key, num_partitions = struct.unpack_from(">iq16si", raw, 0)
    assert raw[32:128] == bytes(96)
    partitions = {}
    for i in range(num_partitions):
        base = 128 + 60 * i
        (pid,) = struct.unpack_from(">i", raw, base)
        structs = []
        for s in range(2):
            start = base + 4 + 28 * s
            session, lwm, local, checksum = struct.unpack_from(">qqqi", raw, start)
            if checksum == crc(raw[start : start + 24]):
                structs.append((session, lwm, local))
        partitions[pid] = max(structs)
    assert len(raw) == 128 + 60 * num_partitions
    return {"version": version, "created": created, "key": key, "partitions": partitions}


def read_segment(seg: Path) -> tuple[tuple, list[tuple]]:
    data = seg.read_bytes()
    index = seg.with_suffix(".idx").read_bytes()
    header = struct.unpack_from(">iq16siq", data, 0)
    assert index[:128] == data[:128]
    first = header[4]
    records = []
    offset = 128
    while offset < len(data):
        txn, c, g, p, q, hdr, length, data_crc = struct.unpack_from(">qiiiiiii", data, offset)
        payload = data[offset + 36 : offset + 36 + length]
        (record_crc,) = struct.unpack_from(">i", data, offset + 36 + length)
        assert record_crc == crc(data[offset : offset + 36 + length])
        assert data_crc == crc(payload)
        (indexed,) = struct.unpack_from(">q", index, 128 + 8 * (txn - first))
        assert indexed == offset
        records.append((txn, (c, g, p, q), hdr, payload, data_crc))
        offset += 40 + length
    assert len(index) == 128 + 8 * len(records)
    return header, records


def test_independent_reader_sees_exactly_what_was_appended(tmp_path):
    appended = make_records(0, 9, size=50)  # 90 bytes each: segments of 4 records at this threshold
    with open_manager(tmp_path, num_partitions=3, segment_size_threshold=400) as manager:
        partition = manager.assign(2)
        for start in range(0, 9, 2):
            partition.append(appended[start : start + 2])
        partition.truncate(6)
        partition.set_low_water_mark(session_id=9, low_water_mark=6)
    control = read_control_file(tmp_path / "waltz-storage.ctl")
    assert control["version"] == 0 and control["key"] == KEY.bytes
    assert control["partitions"] == {0: (-1, -1, -1), 1: (-1, -1, -1), 2: (9, 6, 6)}
    found = []
    segments = sorted((tmp_path / "2").glob("*.seg"))
    assert [s.name for s in segments] == ["0000000000000000000.seg", "0000000000000000004.seg"]
    for seg in segments:
        (version, _, key, pid, first), records = read_segment(seg)
        assert (version, key, pid, first) == (0, KEY.bytes, 2, int(seg.stem))
        found.extend(records)
    expected = [
        (
            r.transaction_id,
            (r.req_id.client_id, r.req_id.generation, r.req_id.partition_id, r.req_id.seq_num),
            r.header,
            r.data,
            r.checksum,
        )
        for r in appended[:7]
    ]
    assert found == expected
