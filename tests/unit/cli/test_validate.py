"""`waltz client validate` against the client library's in-memory MockServer."""

from __future__ import annotations

from typing import Any

from waltz_cli import validate
from waltz_client import MockServer, TransactionContext, WaltzClient


def _factory(server: MockServer):
    def make(callbacks: Any) -> WaltzClient:
        client = WaltzClient(callbacks, driver=server)
        client.wait_mounted()
        return client

    return make


def test_the_shared_write_lock_keeps_data_equal_to_ids():
    server = MockServer(num_partitions=2)
    result = validate.run(
        _factory(server), 1, -1, producers=3, consumers=2, per_producer=15, deadline_s=120, show_progress=False
    )
    assert result["passed"], result
    assert result["committed"] == 45 and result["consumed"] == {"0": 45, "1": 45}
    assert result["mismatches"] == [] and result["consumers_caught_up"]


def test_it_starts_from_the_current_high_water_mark():
    server = MockServer(num_partitions=1)
    first = validate.run(_factory(server), 0, -1, 1, 1, 5, 60, False)
    second = validate.run(_factory(server), 0, 4, 2, 1, 5, 60, False)
    assert first["passed"] and second["passed"], (first, second)
    assert second["consumed"] == {"0": 10}


def test_without_the_lock_stale_writers_are_caught(monkeypatch):
    def unlocked(partition: int, tally: validate.Tally) -> TransactionContext:
        class Unlocked(TransactionContext):
            def partition_id(self, num_partitions: int) -> int:
                return partition

            def execute(self, builder: Any) -> bool:
                builder.set_data(str(builder.client_high_water_mark + 1).encode())
                return True

        return Unlocked()

    monkeypatch.setattr(validate, "_context", unlocked)
    result = validate.run(_factory(MockServer(1)), 0, -1, 3, 1, 10, 120, False)
    assert not result["passed"]
    assert result["mismatches"] and "holds" in result["mismatches"][0]
