"""check_records (a raw read's one-pass check) and join_spans (a RecordRun's bytes and ends)."""

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.unit.storage.test_codec import encoded_run
from waltz_common.types import Record, ReqId
from waltz_storage.codec import check_records, decode_records, encode_record, join_spans
from waltz_storage.errors import ChecksumError, CorruptionError, TornRecordError, TransactionIdMismatch


def test_an_intact_run_passes():
    buf, offsets = encoded_run(7, 4)
    check_records(buf, offsets, 7)
    check_records(b"", [500], 7)  # nothing to check
    empty = encode_record(Record(3, ReqId(1, 2, 3, 4), 0, b"", 0))  # a record without data
    check_records(empty, [0, len(empty)], 3)


@pytest.mark.parametrize(
    ("where", "error", "message"),
    [
        (36 + 2, ChecksumError, "record checksum"),  # the data
        (3, ChecksumError, "record checksum"),  # the prefix's transaction id (the CRC is named first)
        (12, ChecksumError, "record checksum"),  # the prefix's ReqId
        (32, ChecksumError, "record checksum"),  # the prefix's data checksum
        (-1, ChecksumError, "record checksum"),  # the record CRC itself
    ],
)
def test_a_flipped_byte_anywhere_in_a_record_is_refused_as_decode_records_refuses_it(where, error, message):
    buf, offsets = encoded_run(7, 4)
    record = 2  # transaction 9
    start, end = offsets[record] - 500, offsets[record + 1] - 500
    flipped = bytearray(buf)
    flipped[start + where if where >= 0 else end + where] ^= 0x10
    with pytest.raises(error, match=f"record at offset {offsets[record]}: {message}") as raised:
        check_records(bytes(flipped), offsets, 7)
    with pytest.raises(error) as decoded:
        decode_records(bytes(flipped), offsets, 7)
    assert str(raised.value) == str(decoded.value)


@pytest.mark.parametrize("check", [check_records, decode_records])
def test_wrong_ids_torn_ends_and_slots_the_records_do_not_fill_are_refused(check):
    buf, offsets = encoded_run(7, 4)
    with pytest.raises(TransactionIdMismatch, match="offset 500: transaction id 7, expected 6"):
        check(buf, offsets, 6)
    with pytest.raises(TornRecordError, match="present of the"):
        check(buf[:-1], offsets, 7)
    # An index whose slots do not match the records' lengths.
    size = offsets[1] - offsets[0]
    with pytest.raises(CorruptionError, match=f"offset 500: it does not fill its {size + 1} bytes"):
        check(buf, [offsets[0], offsets[1] + 1, offsets[4]], 7)
    with pytest.raises(TornRecordError, match=f"offset 500: needs {size} bytes"):
        check(buf, [offsets[0], offsets[1] - 1, offsets[4]], 7)
    with pytest.raises(TornRecordError):  # a slot shorter than a record's overhead
        check(buf[:10], [500, 510], 7)
    # A length field that says more than its slot holds.
    long = bytearray(buf[: offsets[1] - 500])
    long[28:32] = struct.pack(">i", size)
    with pytest.raises(TornRecordError):
        check(bytes(long), offsets[:2], 7)


@given(st.lists(st.lists(st.binary(max_size=40), max_size=4), min_size=1, max_size=4), st.integers(0, 1000))
def test_joined_spans_give_each_record_its_end(spans_data, origin):
    spans, expected, txn, joined = [], [], 0, b""
    for datas in spans_data:
        blobs = [encode_record(Record(txn + i, ReqId(1, 1, 0, i), 0, d, 0)) for i, d in enumerate(datas)]
        txn += len(blobs)
        offsets = [origin]
        for blob in blobs:
            offsets.append(offsets[-1] + len(blob))
            joined += blob
            expected.append(len(joined))
        spans.append((b"".join(blobs), offsets))
        origin += 7  # each span from another place in another file
    records, ends = join_spans(spans)
    assert records == joined
    assert list(struct.unpack(f"<{len(expected)}I", ends)) == expected
