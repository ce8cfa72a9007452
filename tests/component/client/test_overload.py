"""Submits that find no free pending-append slot, on the mock driver: they wait in a first-come, first-served queue,
each woken once (when its turn comes), time out oldest first, fail at once when the client closes, and go on after
a remount."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Awaitable, Generator
from typing import Any

import pytest

from tests.component.client.helpers import Ctx, client, eventually, payloads, run
from waltz_client import AsyncWaltzClient, MockServer, WaltzClosedError, WaltzTimeoutError


class Steps:
    """Awaits an awaitable and counts how many times its task ran it (its first step and every wake-up)."""

    def __init__(self, awaitable: Awaitable[Any]) -> None:
        self.awaitable = awaitable
        self.steps = 0

    def __await__(self) -> Generator[Any, Any, Any]:
        inner = self.awaitable.__await__()
        sent: Any = None
        while True:
            self.steps += 1
            try:
                yielded = inner.send(sent)
            except StopIteration as done:
                return done.value
            sent = yield yielded


def waiting(c: AsyncWaltzClient) -> int:
    return len(c._partitions[0].slots)


async def queue_up(c: AsyncWaltzClient, count: int) -> list[asyncio.Task[bool]]:
    """count submit_and_wait tasks, started one after the other, all waiting for a slot."""
    tasks = []
    for i in range(count):
        tasks.append(asyncio.create_task(c.submit_and_wait(Ctx(b"w%d" % i))))
        await asyncio.sleep(0)  # each reaches the queue before the next starts
    await eventually(lambda: waiting(c) == count)
    return tasks


async def fill(c: AsyncWaltzClient, server: MockServer, capacity: int) -> list[asyncio.Future[bool]]:
    """Every slot taken by an append the server holds."""
    await c.wait_mounted()
    server.hold_requests()
    return [await c.submit(Ctx(b"held%d" % i)) for i in range(capacity)]


def test_waiting_submits_get_their_slots_in_arrival_order_each_woken_once() -> None:
    async def main() -> None:
        server = MockServer(1)
        async with client(server, **{"client.maxConcurrentTransactions": 2}) as c:
            held = await fill(c, server, 2)
            order: list[int] = []
            steps: list[Steps] = []

            async def submit(i: int) -> bool:
                step = Steps(c.submit(Ctx(b"w%d" % i)))
                steps.append(step)
                future = await step
                order.append(i)
                return await future

            tasks = []
            for i in range(60):
                tasks.append(asyncio.create_task(submit(i)))
                await asyncio.sleep(0)  # each reaches the queue before the next starts
            await eventually(lambda: waiting(c) == 60)
            server.release_requests()
            assert await asyncio.gather(*held, *tasks) == [True] * 62
            assert order == list(range(60))
            # a waiting submit runs twice: to join the queue, and when handed its slot (the herd woke every
            # waiter at every freed slot: 60 waiters, ~60 wake-ups each)
            assert max(s.steps for s in steps) == 2
            assert payloads(server)[2:] == [b"w%d" % i for i in range(60)]

    run(main())


def test_a_waiter_that_is_cancelled_leaves_its_turn_to_the_next() -> None:
    async def main() -> None:
        server = MockServer(1)
        async with client(server, **{"client.maxConcurrentTransactions": 1}) as c:
            held = await fill(c, server, 1)
            tasks = await queue_up(c, 4)
            tasks[1].cancel()
            server.release_requests()
            assert await asyncio.gather(*held, tasks[0], tasks[2], tasks[3]) == [True] * 4
            assert tasks[1].cancelled()
            assert payloads(server) == [b"held0", b"w0", b"w2", b"w3"]
            assert c._partitions[0].slots.reserved == 0

    run(main())


def test_waiters_time_out_after_request_timeout_oldest_first() -> None:
    async def main() -> None:
        server = MockServer(1)
        config = {"client.maxConcurrentTransactions": 1, "client.requestTimeout": 0.3}
        async with client(server, **config) as c:
            held = await fill(c, server, 1)
            failed: list[int] = []

            async def submit(i: int) -> None:
                with pytest.raises(WaltzTimeoutError, match=r"no pending-append slot came free within 0.3 s "
                                                            r"\(client.requestTimeout\)"):
                    await c.submit(Ctx(b"w%d" % i))
                failed.append(i)

            tasks = []
            for i in range(5):
                tasks.append(asyncio.create_task(submit(i)))
                await asyncio.sleep(0.02)
            await asyncio.gather(*tasks)
            assert failed == [0, 1, 2, 3, 4] and waiting(c) == 0
            server.release_requests()
            assert await held[0] is True
            assert await c.submit_and_wait(Ctx(b"after")) is True  # the slot accounting is whole

    run(main())


def test_closing_the_client_fails_every_waiter_at_once() -> None:
    async def main() -> None:
        server = MockServer(1)
        config = {"client.maxConcurrentTransactions": 1, "client.closeTimeout": 0}
        c = client(server, **config)
        async with c:
            await fill(c, server, 1)
            tasks = [asyncio.create_task(c.submit(Ctx(b"w%d" % i))) for i in range(10)]
            await eventually(lambda: waiting(c) == 10)
        # (requestTimeout is 20 s: the run's 60 s limit would not see a wait for it, but each would fail late)
        results = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 5)
        assert all(isinstance(r, WaltzClosedError) for r in results), results

    run(main())


def test_waiters_go_on_after_a_remount() -> None:
    async def main() -> None:
        server = MockServer(1)
        async with client(server, **{"client.maxConcurrentTransactions": 2}) as c:
            held = await fill(c, server, 2)
            tasks = await queue_up(c, 6)
            server.disconnect()  # the held appends are lost: sent again after the remount
            server.release_requests()
            assert await asyncio.gather(*held, *tasks) == [True] * 8
            assert sorted(payloads(server)) == sorted([b"held0", b"held1", *(b"w%d" % i for i in range(6))])

    run(main())


def test_a_submit_that_times_out_waiting_for_a_slot_leaves_no_cycle_for_the_collector() -> None:
    """Under overload thousands of waiters a second time out: each must be freed by reference counting (the cycle
    of a future holding the exception whose traceback holds the waiting frame cost ~13 objects each)."""
    async def main() -> None:
        server = MockServer(1)
        config = {"client.maxConcurrentTransactions": 1, "client.requestTimeout": 0.1}
        async with client(server, **config) as c:
            held = await fill(c, server, 1)

            async def submit(i: int) -> str:
                try:
                    await c.submit(Ctx(b"w%d" % i))
                except WaltzTimeoutError as exc:
                    return str(exc)
                return "no time-out"

            gc.collect()
            gc.disable()
            try:
                messages = await asyncio.gather(*(submit(i) for i in range(50)))
                garbage = gc.collect()
            finally:
                gc.enable()
            assert all("(client.requestTimeout)" in m for m in messages), messages[:1]
            assert garbage == 0
            server.release_requests()
            assert await held[0] is True

    run(main())
