"""The lock hash function written in server.proto: the Python client computes every test vector given there."""

from __future__ import annotations

import re
from pathlib import Path

from waltz_client.locks import PartitionLocalLock

PROTO = Path(__file__).resolve().parents[2] / "protos" / "waltz" / "v1" / "server.proto"
VECTOR = re.compile(r'^//\s+lock_hash\("(?P<name>[^"]*)", (?P<id>-?\d+)\) = (?P<hash>-?\d+)$', re.MULTILINE)


def spec_vectors() -> list[tuple[str, int, int]]:
    return [(m["name"], int(m["id"]), int(m["hash"])) for m in VECTOR.finditer(PROTO.read_text("utf-8"))]


def test_the_python_client_matches_every_vector_of_the_spec():
    vectors = spec_vectors()
    assert len(vectors) >= 10  # the spec still lists them (a broken pattern would find none)
    assert {name for name, _, _ in vectors} >= {"", "123456789", "compte-é", "日本"}  # UTF-8, not ASCII only
    assert [(name, lock_id, PartitionLocalLock(name, lock_id).lock_hash) for name, lock_id, _ in vectors] == vectors
