"""The cross-language lock hash: pinned values and range."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from waltz_client.locks import PartitionLocalLock, lock_hashes

INT64 = st.integers(-(2**63), 2**63 - 1)


@pytest.mark.parametrize(
    ("name", "lock_id", "expected"),
    [
        ("", 0, 0),
        ("", 1, 1),
        ("", -1, 0),  # both 32-bit halves are all ones
        ("", 2**32, 1),  # the high half is folded in
        ("", 2**32 + 1, 0),
        ("123456789", 0, -873187034),  # the CRC-32 check value 0xCBF43926
        ("a", 0, -390611389),  # CRC-32("a") = 0xE8B7BE43
        ("a", 0x7FFFFFFF, -1756872260),  # 0xE8B7BE43 ^ 0x7FFFFFFF = 0x974841BC
        ("account", 42, 2100713102),
        ("\u00e9", 7, 235179321),  # UTF-8 bytes c3 a9
    ],
)
def test_pinned_lock_hashes(name: str, lock_id: int, expected: int) -> None:
    assert PartitionLocalLock(name, lock_id).lock_hash == expected


@settings(max_examples=200)
@given(name=st.text(max_size=20), lock_id=INT64)
def test_hash_is_signed_int32_and_stable(name: str, lock_id: int) -> None:
    h = PartitionLocalLock(name, lock_id).lock_hash
    assert -(2**31) <= h < 2**31
    assert h == PartitionLocalLock(name, lock_id).lock_hash


@pytest.mark.parametrize("lock_id", [2**63, -(2**63) - 1])
def test_id_must_be_int64(lock_id: int) -> None:
    with pytest.raises(ValueError):
        PartitionLocalLock("x", lock_id)


def test_lock_hashes_dedups_in_order() -> None:
    locks = [PartitionLocalLock("b", 1), PartitionLocalLock("a", 1), PartitionLocalLock("b", 1)]
    assert lock_hashes(locks) == [locks[0].lock_hash, locks[1].lock_hash]
    assert len({PartitionLocalLock("a", 1), PartitionLocalLock("a", 1)}) == 1
