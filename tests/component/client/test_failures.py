"""Failure detection on the mock driver: lost appends, cut streams, lock failures, timeouts."""

import asyncio
import random
from typing import Any

import pytest

from tests.component.client.helpers import Ctx, MemoryCallbacks, client, eventually, payloads, run
from waltz_client import (
    ClientAheadError,
    ClientIdDeniedError,
    MockServer,
    PartitionLocalLock,
    RetriesExhaustedError,
    TransactionDataError,
    TransactionRejectedError,
    WaltzTimeoutError,
)
from waltz_common.types import Record, ReqId


def test_an_append_the_server_drops_is_reported_failed() -> None:
    async def main() -> None:
        server = MockServer(1)
        async with client(server, **{"client.maxRetries": 0}) as c:
            server.force_next_append_fail()
            lost = Ctx(b"lost")
            future = await c.submit(lost)
            with pytest.raises(RetriesExhaustedError, match="not in the feed up to the flush"):
                await future  # found by the flush sent after client.longWaitThresholdSeconds
            assert lost.hooks[0][0] == "exception" and c.stats.failed_appends == 1
        assert payloads(server) == []

    run(main())


def test_a_dropped_append_is_failed_by_a_later_commit_and_retried() -> None:
    async def main() -> None:
        server = MockServer(1)
        async with client(server, **{"client.longWaitThresholdSeconds": 60}) as c:
            await c.wait_mounted()
            server.hold_requests()
            first, second = Ctx(b"first"), Ctx(b"second")
            futures = [await c.submit(first), await c.submit(second)]
            server.force_next_append_fail()
            server.release_requests()
            assert await asyncio.gather(*futures) == [True, True]
            assert c.stats.failed_appends == 1 and c.stats.retries == 1
            assert first.executed_at == [-1, 0]  # re-executed against the state after "second"
        assert payloads(server) == [b"second", b"first"]

    run(main())


def test_a_cut_mid_stream_resolves_pending_appends_exactly_as_the_feed_says() -> None:
    async def main() -> None:
        server = MockServer(1)
        callbacks = MemoryCallbacks()
        async with client(server, callbacks, **{"client.maxConcurrentTransactions": 10,
                                                "client.longWaitThresholdSeconds": 60}) as c:
            assert await (await c.submit(Ctx(b"warm-up"))) is True
            server.suspend_feed()  # these commit at the server, but the client is not told
            reached = [Ctx(b"reached%d" % i) for i in range(3)]
            futures = [await c.submit(ctx) for ctx in reached]
            await eventually(lambda: server.high_water_mark(0) == 3)
            server.hold_requests()  # these are still in flight when the stream is cut
            lost = [Ctx(b"lost%d" % i) for i in range(3)]
            futures += [await c.submit(ctx) for ctx in lost]
            await asyncio.sleep(0.05)
            assert server.disconnect(c.client_id) == 1
            server.release_requests()
            server.resume_feed()
            assert await asyncio.gather(*futures) == [True] * 6
            # still pending when the remount completed: a remount proves nothing, so they were sent again with
            # their sequence numbers (issue 24), not executed again
            assert c.stats.failed_appends == 0 and c.stats.retries == 0
        for ctx in reached:
            assert ctx.executed_at == [0] and ctx.hooks == [("completion", True), ("application",)]
        for ctx in lost:
            assert len(ctx.executed_at) == 1 and ctx.hooks == [("completion", True), ("application",)]
        log = payloads(server)
        assert log[:4] == [b"warm-up", b"reached0", b"reached1", b"reached2"]
        assert sorted(log[4:]) == [b"lost0", b"lost1", b"lost2"]
        assert [d for _, d in callbacks.applied[0]] == log  # each applied once, in order

    run(main())


def test_random_cuts_and_delays_lose_and_duplicate_nothing() -> None:
    async def main() -> None:
        server = MockServer(2)
        server.set_max_delay(0.005)
        callbacks = MemoryCallbacks()
        rng = random.Random(7)
        async with client(server, callbacks, **{"client.longWaitThresholdSeconds": 0.1}) as c:
            contexts = [Ctx(b"t%d" % i, partition=i) for i in range(60)]
            futures = []
            for ctx in contexts:
                futures.append(await c.submit(ctx))
                if rng.random() < 0.1:
                    server.disconnect(c.client_id)
            assert await asyncio.gather(*futures) == [True] * 60
            await c.flush()
        for pid in (0, 1):
            assert [d for _, d in callbacks.applied[pid]] == payloads(server, pid)
        assert sorted(payloads(server, 0) + payloads(server, 1)) == sorted(ctx.data for ctx in contexts)

    run(main())


@pytest.mark.callback_modes("thread")  # applies fetch the other client's data
def test_a_context_is_retried_after_a_lock_failure_once_caught_up_and_commits() -> None:
    async def main() -> None:
        server = MockServer(1)
        lock = PartitionLocalLock("account", 42)
        async with client(server) as a, client(server) as b:
            assert await (await b.submit(Ctx(b"b-first"))) is True
            server.suspend_feed()  # b will not hear about a's commit for now
            assert await asyncio.wait_for(_commit_unfed(server, a, Ctx(b"a", write=[lock])), 10)
            loser = Ctx(b"b", write=[lock])
            future = await b.submit(loser)
            await eventually(lambda: ("lock_failure",) in loser.hooks)
            await asyncio.sleep(0.1)
            assert not future.done()  # waits until b has applied transaction 1
            server.resume_feed()
            assert await future is True
        assert loser.executed_at == [0, 1]
        assert loser.hooks == [("lock_failure",), ("completion", True), ("application",)]
        assert payloads(server) == [b"b-first", b"a", b"b"]

    run(main())


async def _commit_unfed(server: MockServer, c, ctx: Ctx) -> bool:
    before = server.high_water_mark(0)
    await c.submit(ctx)
    await eventually(lambda: server.high_water_mark(0) == before + 1)
    return True


def test_forced_lock_failures_exhaust_a_bounded_retry_budget() -> None:
    async def main() -> None:
        server = MockServer(1)
        async with client(server, **{"client.maxRetries": 1}) as c:
            server.force_next_lock_fail(2)
            ctx = Ctx(b"t", read=[PartitionLocalLock("x", 1)])
            with pytest.raises(RetriesExhaustedError, match="lock failure"):
                await (await c.submit(ctx))
            assert [h[0] for h in ctx.hooks] == ["lock_failure", "lock_failure", "exception"]
            server.force_next_lock_fail(1)
            ok = Ctx(b"u")
            assert await (await c.submit(ok)) is True
            assert ok.hooks[0] == ("lock_failure",)

    run(main())


def test_timeouts_raise_instead_of_hanging() -> None:
    async def main() -> None:
        server = MockServer(2)
        server.set_partition_available(1, False)
        config = {"client.mountTimeout": 0.5, "client.requestTimeout": 0.5, "client.maxConcurrentTransactions": 1}
        async with client(server, **config) as c:
            with pytest.raises(WaltzTimeoutError, match="partition 1 was not mounted"):
                await c.wait_mounted()
            with pytest.raises(WaltzTimeoutError, match="partition 1 was not mounted"):
                await c.submit(Ctx(b"x", partition=1))
            assert await (await c.submit(Ctx(b"ok"))) is True
            server.hold_requests()
            pending = await c.submit(Ctx(b"held"))
            with pytest.raises(WaltzTimeoutError,
                               match=r"no pending-append slot came free within 0.5 s \(client.requestTimeout\)"):
                await c.submit(Ctx(b"no room"))
            with pytest.raises(WaltzTimeoutError, match="still pending"):
                await c.flush(timeout=0.3)
            server.release_requests()
            assert await pending is True

    run(main())


def test_client_ahead_is_an_error_not_a_retry() -> None:
    async def main() -> None:
        server = MockServer(1)
        async with client(server, MemoryCallbacks(start={0: 5})) as c:
            with pytest.raises(ClientAheadError, match="high-water mark is -1"):
                await c.submit(Ctx(b"x"))

    run(main())


def test_a_client_id_denied_is_an_error_not_a_retry() -> None:
    # mutual TLS: a server answers PERMISSION_DENIED when the client id belongs to another certificate (issue 25)
    async def main() -> None:
        server = MockServer(1)
        server.deny_client_id(1)  # the first client's id: its mount is refused
        async with client(server) as c:
            assert c.client_id == 1
            with pytest.raises(ClientIdDeniedError, match="client id 1 refused: client id belongs to another"):
                await c.submit(Ctx(b"x"))
        async with client(server) as c:
            assert await (await c.submit(Ctx(b"ok"))) is True
            server.deny_client_id(c.client_id)  # an append refused: for good, not retried
            with pytest.raises(TransactionRejectedError, match="belongs to another identity"):
                await (await c.submit(Ctx(b"refused")))

    run(main())


def test_transaction_data_checksums_are_verified_with_bounded_retries() -> None:
    async def main() -> None:
        server = MockServer(1)
        async with client(server) as writer:
            assert await (await writer.submit(Ctx(b"payload"))) is True
            server.corrupt_next_data(1)
            assert await writer.transaction_data(0, 0) == b"payload"
            server.corrupt_next_data(10)
            with pytest.raises(TransactionDataError, match="checksum"):
                await writer.transaction_data(0, 0)
            server.corrupt_next_data(0)
            with pytest.raises(TransactionDataError, match="does not exist"):
                await writer.transaction_data(0, 7)

    run(main())


def test_a_feed_that_stops_is_requested_again() -> None:
    async def main() -> None:
        server = MockServer(1)
        async with client(server) as c:
            assert await (await c.submit(Ctx(b"first"))) is True
            server.end_feeds()
            assert await (await c.submit(Ctx(b"second"))) is True  # after two flush answers ahead
        assert payloads(server) == [b"first", b"second"]

    run(main())


@pytest.mark.callback_modes("thread")  # the reader's applies fetch the writer's data
def test_a_reader_mounts_again_when_the_server_ends_its_feed() -> None:
    """A partition restarted on the same server and generation (after a failure): a client that only reads
    has no append to be refused and sends no flush, so only the server's unasked NOT_READY tells it."""
    async def main() -> None:
        server = MockServer(1)
        applied = MemoryCallbacks()
        async with client(server) as writer, client(server, applied) as reader:
            assert await (await writer.submit(Ctx(b"first"))) is True
            await reader.wait_mounted()
            await eventually(lambda: applied.hwm.get(0) == 0)
            server.restart_partition(0)
            assert await (await writer.submit(Ctx(b"second"))) is True
            await eventually(lambda: applied.hwm.get(0) == 1)
            assert [data for _, data in applied.applied[0]] == [b"first", b"second"]

    run(main())


def test_a_transaction_the_server_refuses_is_an_error_not_a_retry() -> None:
    async def main() -> None:
        server = MockServer(1)
        server.max_transaction_bytes = 10
        async with client(server) as c:
            big = Ctx(b"x" * 11)
            with pytest.raises(TransactionRejectedError, match="more than the limit"):
                await (await c.submit(big))
            assert len(big.executed_at) == 1 and big.hooks[0][0] == "exception"
            assert await (await c.submit(Ctx(b"small"))) is True

    run(main())


def test_feed_entries_of_another_partition_in_a_batch_are_ignored_and_logged(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    send_feed = MockServer._send_feed

    def mixed(server: MockServer, stream: Any, records: list[Record]) -> None:  # each batch also has a stranger
        stranger = Record(records[0].transaction_id, ReqId(99, 0, 1, 1), 0, b"", 0) if records else None
        send_feed(server, stream, records + ([stranger] if stranger else []))

    monkeypatch.setattr(MockServer, "_send_feed", mixed)

    async def main() -> None:
        server = MockServer(2)
        callbacks = MemoryCallbacks()
        async with client(server, callbacks) as c:
            assert await asyncio.gather(*[await c.submit(Ctx(b"p0-%d" % i)) for i in range(3)]) == [True] * 3
        assert callbacks.applied[0] == [(i, b"p0-%d" % i) for i in range(3)] and 1 not in callbacks.applied

    run(main())
    assert "feed entries of other partitions" in caplog.text
