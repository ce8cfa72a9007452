"""The lock hash function written in server.proto: the Python client computes every test vector given there."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from waltz_client.locks import PartitionLocalLock, lock_key_id

PROTO = Path(__file__).resolve().parents[2] / "protos" / "waltz" / "v1" / "server.proto"
VECTOR = re.compile(r'^//\s+lock_hash\("(?P<name>[^"]*)", (?P<id>-?\d+)\) = (?P<hash>-?\d+)$', re.MULTILINE)


def spec_vectors() -> list[tuple[str, int, int]]:
    return [(m["name"], int(m["id"]), int(m["hash"])) for m in VECTOR.finditer(PROTO.read_text("utf-8"))]


def test_the_python_client_matches_every_vector_of_the_spec():
    vectors = spec_vectors()
    assert len(vectors) >= 10  # the spec still lists them (a broken pattern would find none)
    assert {name for name, _, _ in vectors} >= {"", "123456789", "compte-é", "日本"}  # UTF-8, not ASCII only
    assert [(name, lock_id, PartitionLocalLock(name, lock_id).lock_hash) for name, lock_id, _ in vectors] == vectors


DOC = Path(__file__).resolve().parents[2] / "docs" / "protocol.md"
KEY_VECTOR = re.compile(r'^\s+- lock_key_id\("(?P<key>[^"]*)"\) = (?P<id>-?\d+)$', re.MULTILINE)


def test_string_keys_get_the_lock_ids_protocol_md_lists():
    vectors = [(m["key"], int(m["id"])) for m in KEY_VECTOR.finditer(DOC.read_text("utf-8"))]
    assert len(vectors) >= 6 and any(not key.isascii() for key, _ in vectors)
    assert [(key, lock_key_id(key)) for key, _ in vectors] == vectors
    assert lock_key_id("sku-123") == lock_key_id(b"sku-123")  # a str is its UTF-8 bytes
    lock = PartitionLocalLock.of_key("item", "sku-123")
    assert lock == PartitionLocalLock("item", -6883691902789088315)
    assert lock.lock_hash == PartitionLocalLock("item", lock_key_id("sku-123")).lock_hash


def test_an_unsupported_lock_id_fails_at_construction_with_a_hint():
    with pytest.raises(TypeError, match=r"not str \(for a string or bytes key: PartitionLocalLock.of_key"):
        PartitionLocalLock("item", "sku-123")  # type: ignore[arg-type]
    for bad in (1.5, None, True):
        with pytest.raises(TypeError, match="a lock id is an int"):
            PartitionLocalLock("item", bad)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="a lock name is a str"):
        PartitionLocalLock(b"item", 1)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="a lock key is a str or bytes"):
        lock_key_id(42)  # type: ignore[arg-type]
