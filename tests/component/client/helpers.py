"""Callbacks and contexts that record what happened, for client tests on the mock driver."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from waltz_client import (
    AsyncWaltzClient,
    MockServer,
    PartitionLocalLock,
    Transaction,
    TransactionBuilder,
    TransactionContext,
    WaltzClientCallbacks,
)

FAST = {
    "client.longWaitThresholdSeconds": 0.2,
    "client.mountTimeout": 10,
    "client.requestTimeout": 20,
}


def run(coro: Coroutine[Any, Any, Any]) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 60))


async def eventually(check: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.01)


class MemoryCallbacks(WaltzClientCallbacks):
    """Applies into lists and checks the apply order; shares an event log with contexts."""

    def __init__(self, events: list[tuple[Any, ...]] | None = None, start: dict[int, int] | None = None) -> None:
        self.hwm: dict[int, int] = dict(start or {})
        self.applied: dict[int, list[tuple[int, bytes]]] = {}
        self.events = events if events is not None else []
        self.exceptions: list[tuple[int, int, BaseException]] = []
        self.fail_next_applies = 0
        self.lock = threading.Lock()

    def get_client_high_water_mark(self, partition_id: int) -> int:
        return self.hwm.get(partition_id, -1)

    def apply_transaction(self, transaction: Transaction) -> None:
        if self.fail_next_applies:
            self.fail_next_applies -= 1
            raise RuntimeError("application database is down")
        pid = transaction.partition_id
        assert transaction.transaction_id == self.hwm.get(pid, -1) + 1, "applied out of order or twice"
        data = transaction.data()
        with self.lock:
            self.applied.setdefault(pid, []).append((transaction.transaction_id, data))
            self.hwm[pid] = transaction.transaction_id
        self.events.append(("apply", pid, transaction.transaction_id, data))

    def uncaught_exception(self, partition_id: int, transaction_id: int, exc: BaseException) -> None:
        self.exceptions.append((partition_id, transaction_id, exc))


class Ctx(TransactionContext):
    """Appends data to a partition, with optional locks; records every hook call."""

    def __init__(
        self, data: bytes, partition: int = 0, events: list[tuple[Any, ...]] | None = None,
        write: Sequence[PartitionLocalLock] = (), read: Sequence[PartitionLocalLock] = (),
        append: Sequence[PartitionLocalLock] = (), result: bool | Callable[[TransactionBuilder], bool] = True,
    ) -> None:
        self.data = data
        self.partition = partition
        self.events = events if events is not None else []
        self.write, self.read, self.append = write, read, append
        self.result = result
        self.executed_at: list[int] = []
        self.hooks: list[Any] = []

    def partition_id(self, num_partitions: int) -> int:
        return self.partition % num_partitions

    def execute(self, builder: TransactionBuilder) -> bool:
        self.executed_at.append(builder.client_high_water_mark)
        builder.set_data(self.data)
        builder.set_write_locks(self.write)
        builder.set_read_locks(self.read)
        builder.set_append_locks(self.append)
        return self.result(builder) if callable(self.result) else self.result

    def on_completion(self, committed: bool) -> None:
        self.hooks.append(("completion", committed))
        self.events.append(("completion", self.data, committed))

    def on_application(self) -> None:
        self.hooks.append(("application",))
        self.events.append(("application", self.data))

    def on_exception(self, exc: BaseException) -> None:
        self.hooks.append(("exception", exc))

    def on_lock_failure(self) -> None:
        self.hooks.append(("lock_failure",))


def client(server: MockServer, callbacks: WaltzClientCallbacks | None = None, **config: Any) -> AsyncWaltzClient:
    return AsyncWaltzClient(callbacks or MemoryCallbacks(), {**FAST, **config}, driver=server)


def payloads(server: MockServer, partition: int = 0) -> list[bytes]:
    return [r.data for r in server.records(partition)]
