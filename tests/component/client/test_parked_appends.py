"""The client's own-lock parking (OwnLocks) through the shell: an append whose lock one of the client's own pending
appends writes waits unsent; when that one ends, the lock goes to the FIRST parked append only, which executes
again while the others stay parked. Every way the holding append can end hands the lock on (committed, lock
failure, given up, declined or raising when executed again, the client closing): none leaves a submission parked
for ever (issue 31)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from tests.component.client.helpers import Ctx, client, eventually, run
from waltz_client import (
    AsyncWaltzClient,
    MockServer,
    PartitionLocalLock,
    TransactionBuilder,
    WaltzClosedError,
)

HOT = [PartitionLocalLock("item", 1)]


async def parked_behind_one(c: AsyncWaltzClient, server: MockServer, contexts: list[Ctx]) -> list[asyncio.Future[bool]]:
    """The first context's append pending (the server holds requests), the others parked behind it."""
    await c.submit(Ctx(b"warm-up"))
    await c.flush()
    server.hold_requests()
    futures = [await c.submit(ctx) for ctx in contexts]
    await eventually(lambda: all(ctx.executed_at for ctx in contexts))
    await asyncio.sleep(0.05)
    assert [len(ctx.executed_at) for ctx in contexts] == [1] * len(contexts)
    return futures


def test_a_freed_lock_goes_to_the_first_parked_append_and_each_executes_once_more() -> None:
    async def main() -> None:
        server = MockServer(1)
        async with client(server) as c:
            contexts = [Ctx(b"r%d" % i, write=HOT) for i in range(5)]
            futures = await parked_behind_one(c, server, contexts)
            assert len(server.records(0)) == 1  # only the warm-up: the parked ones were not sent
            server.release_requests()
            assert await asyncio.gather(*futures) == [True] * 5
        # handed on one at a time: before, every parked append executed again at each commit (1+2+3+4 extra)
        assert [len(ctx.executed_at) for ctx in contexts] == [1, 2, 2, 2, 2]
        assert [r.data for r in server.records(0)][1:] == [b"r%d" % i for i in range(5)]  # FIFO

    run(main())


@pytest.mark.parametrize("end", ["lock failure", "given up"])
def test_a_holder_that_fails_hands_its_lock_on(end: str) -> None:
    async def main() -> None:
        server = MockServer(1)
        retries: dict[str, object] = {"client.maxRetries": 0} if end == "given up" else {}
        async with client(server, None, **retries) as c:
            contexts = [Ctx(b"r%d" % i, write=HOT) for i in range(3)]
            futures = await parked_behind_one(c, server, contexts)
            server.force_next_lock_fail()
            server.release_requests()
            results = await asyncio.gather(*futures, return_exceptions=True)
        if end == "given up":
            assert isinstance(results[0], Exception) and results[1:] == [True, True]
        else:
            assert results == [True] * 3  # r0 executed again, behind r2
            assert [r.data for r in server.records(0)][1:] == [b"r1", b"r2", b"r0"]

    run(main())


def declines_the_second_time(ctx: Ctx, how: str) -> Callable[[TransactionBuilder], bool]:
    def result(_builder: TransactionBuilder) -> bool:
        if len(ctx.executed_at) < 2:
            return True
        if how == "raises":
            raise RuntimeError("the database went away")
        return False

    return result


@pytest.mark.parametrize("how", ["declines", "raises"])
def test_an_append_handed_the_lock_that_ends_without_sending_hands_it_on(how: str) -> None:
    async def main() -> None:
        server = MockServer(1)
        async with client(server) as c:
            contexts = [Ctx(b"r%d" % i, write=HOT) for i in range(3)]
            contexts[1].result = declines_the_second_time(contexts[1], how)
            futures = await parked_behind_one(c, server, contexts)
            server.release_requests()
            results = await asyncio.gather(*futures, return_exceptions=True)
        assert results[0] is True and results[2] is True
        assert results[1] is False if how == "declines" else isinstance(results[1], RuntimeError)

    run(main())


def test_an_append_handed_the_lock_that_now_takes_another_lock_hands_it_on_at_once() -> None:
    async def main() -> None:
        server = MockServer(1)
        async with client(server) as c:
            contexts = [Ctx(b"r%d" % i, write=HOT) for i in range(3)]
            futures = await parked_behind_one(c, server, contexts)
            contexts[1].write = [PartitionLocalLock("item", 2)]  # its read of the database chose another item
            server.release_requests()
            assert await asyncio.gather(*futures) == [True] * 3
        assert [len(ctx.executed_at) for ctx in contexts] == [1, 2, 2]

    run(main())


def test_closing_the_client_ends_the_parked_appends() -> None:
    async def main() -> None:
        server = MockServer(1)
        c = client(server)
        await c.start()
        contexts = [Ctx(b"r%d" % i, write=HOT) for i in range(4)]
        futures = await parked_behind_one(c, server, contexts)
        await c.close()
        for future in futures:
            with pytest.raises(WaltzClosedError):
                await future

    run(main())
