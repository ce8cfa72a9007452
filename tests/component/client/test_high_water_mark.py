"""AsyncWaltzClient.high_water_mark while the partition's owner is not ready (recovering after a move)."""

from __future__ import annotations

from typing import Any

import grpc
import pytest

from waltz_client import AsyncWaltzClient, MockServer
from waltz_client.mock import MockDriver

from .helpers import FAST, MemoryCallbacks, run


def _unavailable(code: grpc.StatusCode, details: str) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details=details)


def _failing_first(monkeypatch: pytest.MonkeyPatch, errors: list[grpc.aio.AioRpcError]) -> list[int]:
    """GetHighWaterMark of the last partition raises errors (one per call) before answering; returns its calls.
    (The client's own asks, of the other partitions, go through.)"""
    calls: list[int] = []
    answer = MockDriver.get_high_water_mark

    async def get_high_water_mark(self: MockDriver, endpoint: str, partition_id: int, timeout: float) -> Any:
        if partition_id == self.server.num_partitions - 1:
            calls.append(partition_id)
            if len(calls) <= len(errors):
                raise errors[len(calls) - 1]
        return await answer(self, endpoint, partition_id, timeout)

    monkeypatch.setattr(MockDriver, "get_high_water_mark", get_high_water_mark)
    return calls


def test_a_partition_not_ready_yet_is_asked_again_not_raised(monkeypatch: pytest.MonkeyPatch) -> None:
    """The server answers UNAVAILABLE "partition 2 is not ready yet: retry shortly" while a moved partition
    recovers (and FAILED_PRECONDITION from its old owner): the client asks again (a chaos test's checker met it
    after a frozen owner's partitions moved)."""
    server = MockServer(3)
    errors = [
        _unavailable(grpc.StatusCode.UNAVAILABLE, "partition 2 is not ready yet: retry shortly"),
        _unavailable(grpc.StatusCode.FAILED_PRECONDITION, "partition 2 is not owned by this server"),
    ]

    async def main() -> tuple[int, list[int]]:
        async with AsyncWaltzClient(MemoryCallbacks(), FAST, driver=server) as client:
            await client.wait_mounted()
            calls = _failing_first(monkeypatch, errors)
            return await client.high_water_mark(2), calls

    mark, calls = run(main())
    assert mark == -1
    assert len(calls) >= 3  # two refused, then answered


def test_other_errors_and_the_request_timeout_still_raise(monkeypatch: pytest.MonkeyPatch) -> None:
    server = MockServer(1)

    async def ask(errors: list[grpc.aio.AioRpcError], config: dict[str, Any]) -> None:
        async with AsyncWaltzClient(MemoryCallbacks(), {**FAST, **config}, driver=server) as client:
            await client.wait_mounted()
            _failing_first(monkeypatch, errors)
            await client.high_water_mark(0)

    with pytest.raises(grpc.aio.AioRpcError) as raised:
        run(ask([_unavailable(grpc.StatusCode.PERMISSION_DENIED, "not yours")], {}))
    assert raised.value.code() is grpc.StatusCode.PERMISSION_DENIED
    monkeypatch.undo()

    with pytest.raises(grpc.aio.AioRpcError) as raised:
        run(ask([_unavailable(grpc.StatusCode.UNAVAILABLE, "not ready")] * 1000, {"client.requestTimeout": 0.5}))
    assert raised.value.code() is grpc.StatusCode.UNAVAILABLE
