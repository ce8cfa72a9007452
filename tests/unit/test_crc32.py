"""The shared CRC-32 is the IEEE CRC-32 of zlib (java.util.zip.CRC32), as a signed 32-bit int."""

import zlib

from hypothesis import given
from hypothesis import strategies as st

from waltz_common.types import INT32_MAX, INT32_MIN, crc32, crc32_unsigned


@given(st.binary(max_size=4096))
def test_matches_zlib(data: bytes) -> None:
    expected = zlib.crc32(data)
    assert crc32_unsigned(data) == expected
    assert crc32(data) & 0xFFFFFFFF == expected
    assert INT32_MIN <= crc32(data) <= INT32_MAX


def test_known_values() -> None:
    assert crc32(b"") == 0
    assert crc32(b"123456789") == 0xCBF43926 - 2**32  # the CRC-32 check value, signed
    assert crc32_unsigned(memoryview(b"123456789")) == 0xCBF43926
