"""Partition-local lock names, their stable cross-language 32-bit hash, and lock ids of string or bytes keys."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass

from waltz_common.types import crc32

_INT64_MIN = -(2**63)
_INT64_MAX = 2**63 - 1
_U32 = 0xFFFFFFFF


@dataclass(frozen=True, slots=True)
class PartitionLocalLock:
    """A lock on (name, id), scoped to one partition; `id` is a signed 64-bit integer.

    The server only sees `lock_hash`, a signed 32-bit int. Every client, in any language,
    must compute it the same way, so it is defined on bytes and bit patterns only:

        h = CRC32(UTF-8(name)) XOR (id & 0xFFFFFFFF) XOR ((id >> 32) & 0xFFFFFFFF)
        lock_hash = h interpreted as a two's-complement signed 32-bit int

    CRC32 is the IEEE polynomial (zlib, java.util.zip.CRC32); `id` is taken as its 64-bit
    two's-complement pattern (so the two 32-bit halves are those of Java's long). Examples:
    ("", 0) -> 0, ("", 1) -> 1, ("", -1) -> 0, ("123456789", 0) -> -873187034 (0xCBF43926).
    Distinct locks may share a hash: the server then reports a spurious lock failure, never
    a missed one.

    A lock on a string or bytes key (an SKU, an account number): `PartitionLocalLock.of_key(name, key)`,
    whose id is `lock_key_id(key)`, the same in every process and language (never Python's hash(),
    which differs per process).
    """

    name: str
    id: int

    def __post_init__(self) -> None:
        if not isinstance(self.name, str):
            raise TypeError(f"a lock name is a str, not {type(self.name).__name__}")
        if not isinstance(self.id, int) or isinstance(self.id, bool):
            hint = " (for a string or bytes key: PartitionLocalLock.of_key(name, key))" if isinstance(
                self.id, str | bytes | bytearray) else ""
            raise TypeError(f"a lock id is an int (signed 64-bit), not {type(self.id).__name__}{hint}")
        if not _INT64_MIN <= self.id <= _INT64_MAX:
            raise ValueError(f"lock id {self.id} is outside the signed 64-bit range")

    @classmethod
    def of_key(cls, name: str, key: str | bytes) -> PartitionLocalLock:
        """The lock on (name, key) for a string or bytes key: PartitionLocalLock(name, lock_key_id(key))."""
        return cls(name, lock_key_id(key))

    @property
    def lock_hash(self) -> int:
        h = (crc32(self.name.encode("utf-8")) & _U32) ^ (self.id & _U32) ^ ((self.id >> 32) & _U32)
        return h - 2**32 if h >= 2**31 else h


def lock_key_id(key: str | bytes) -> int:
    """The lock id of a string or bytes key, the same in every language (docs/protocol.md, "Lock keys"): the first
    8 bytes of the SHA-256 of the key's bytes (a str's UTF-8 encoding) as a big-endian signed 64-bit integer."""
    if isinstance(key, str):
        data = key.encode("utf-8")
    elif isinstance(key, bytes | bytearray | memoryview):
        data = bytes(key)
    else:
        raise TypeError(f"a lock key is a str or bytes, not {type(key).__name__} (an int is a lock id already)")
    return int.from_bytes(hashlib.sha256(data).digest()[:8], "big", signed=True)


def lock_hashes(locks: Iterable[PartitionLocalLock]) -> list[int]:
    """The hashes to put in an append request, duplicates removed, in first-seen order."""
    return list(dict.fromkeys(lock.lock_hash for lock in locks))
