"""The client shell on the mock driver: commits, hook order, declines, errors, batching, feeds."""

import asyncio
import threading

import pytest

from tests.component.client.helpers import Ctx, MemoryCallbacks, client, eventually, payloads, run
from waltz_client import MockServer, Transaction, TransactionContext, WaltzClosedError, WaltzError


def test_commits_are_applied_in_order_with_hooks_around_own_applies() -> None:
    async def main() -> None:
        server = MockServer(2)
        events: list[tuple] = []
        callbacks = MemoryCallbacks(events)
        async with client(server, callbacks) as c:
            contexts = [Ctx(b"t%d" % i, partition=i, events=events) for i in range(12)]
            futures = [await c.submit(ctx) for ctx in contexts]
            assert await asyncio.gather(*futures) == [True] * 12
            assert c.client_high_water_mark(0) == 5 and c.client_high_water_mark(1) == 5
            assert await c.high_water_mark(1) == 5
        for ctx in contexts:
            assert ctx.hooks == [("completion", True), ("application",)]
            mine = [e for e in events if e[-1 if e[0] == "apply" else 1] == ctx.data]
            assert [e[0] for e in mine] == ["completion", "apply", "application"]
        assert [d for _, d in callbacks.applied[0]] == payloads(server, 0)
        assert sorted(payloads(server, 0) + payloads(server, 1)) == sorted(ctx.data for ctx in contexts)

    run(main())


def test_hooks_set_on_an_instance_or_overridden_alone_are_called() -> None:
    class OnlyApplication(Ctx):
        on_completion = TransactionContext.on_completion  # the empty default again: not called

    async def main() -> None:
        server = MockServer(1)
        async with client(server) as c:
            seen: list[tuple] = []
            plain = OnlyApplication(b"a")
            patched = OnlyApplication(b"b")
            patched.on_completion = lambda committed: seen.append(("completion", committed))  # type: ignore[method-assign]
            patched.on_application = lambda: seen.append(("application",))  # type: ignore[method-assign]
            assert await (await c.submit(plain)) and await (await c.submit(patched))
        assert plain.hooks == [("application",)] and patched.hooks == []
        assert seen == [("completion", True), ("application",)]

    run(main())


def test_declined_and_raising_contexts() -> None:
    async def main() -> None:
        server = MockServer(1)
        async with client(server) as c:
            declined = Ctx(b"no", result=False)
            assert await (await c.submit(declined)) is False
            assert declined.hooks == [("completion", False)]

            def explode(_builder: object) -> bool:
                raise ValueError("bad state")

            raising = Ctx(b"boom", result=explode)
            future = await c.submit(raising)
            with pytest.raises(ValueError, match="bad state"):
                await future
            assert raising.hooks[0][0] == "exception"
            assert c.stats.declined == 1 and c.stats.errors == 1
        assert server.high_water_mark(0) == -1

    run(main())


@pytest.mark.callback_modes("thread")  # applies fetch the other client's data
def test_two_clients_each_see_every_transaction_and_fetch_data_lazily() -> None:
    async def main() -> None:
        server = MockServer(1)
        a, b = MemoryCallbacks(), MemoryCallbacks()
        async with client(server, a) as ca, client(server, b) as cb:
            assert ca.client_id != cb.client_id
            futures = [await ca.submit(Ctx(b"a%d" % i)) for i in range(5)]
            futures += [await cb.submit(Ctx(b"b%d" % i)) for i in range(5)]
            await asyncio.gather(*futures)
            await eventually(lambda: len(a.applied.get(0, [])) == 10 and len(b.applied.get(0, [])) == 10)
        assert a.applied == b.applied
        assert [d for _, d in a.applied[0]] == payloads(server)

    run(main())


def test_appends_submitted_together_share_one_batch() -> None:
    async def main() -> None:
        server = MockServer(1)
        async with client(server, **{"client.maxConcurrentTransactions": 20}) as c:
            await c.submit(Ctx(b"warm-up"))
            await c.flush()
            server.hold_requests()
            futures = [await c.submit(Ctx(b"t%d" % i)) for i in range(10)]
            await asyncio.sleep(0.2)
            server.release_requests()
            await asyncio.gather(*futures)
        assert max(server.append_batch_sizes) > 1
        assert sum(server.append_batch_sizes) == 11

    run(main())


def test_close_fails_what_is_pending() -> None:
    async def main() -> None:
        server = MockServer(1)
        c = client(server)
        await c.start()
        assert await (await c.submit(Ctx(b"first"))) is True
        server.hold_requests()
        ctx = Ctx(b"stuck")
        future = await c.submit(ctx)
        await eventually(lambda: c.has_pending_transactions())
        await asyncio.sleep(0.05)
        await c.close()
        with pytest.raises(WaltzClosedError):
            await future
        assert ctx.hooks and ctx.hooks[-1][0] == "exception"
        with pytest.raises(WaltzClosedError):
            await c.submit(Ctx(b"late"))

    run(main())


class _BadPartition(Ctx):
    def __init__(self, partition: object) -> None:
        super().__init__(b"bad")
        self.bad = partition

    def partition_id(self, num_partitions: int) -> int:
        return self.bad  # type: ignore[return-value]


def test_submit_rejects_bad_partitions_and_unmounted_ones() -> None:
    async def main() -> None:
        server = MockServer(2)
        async with client(server, **{"client.autoMount": False}) as c:
            assert c.partitions == []
            with pytest.raises(WaltzError, match="not mounted"):
                await c.submit(Ctx(b"x", partition=1))
            c.mount_partitions([1])
            assert await (await c.submit(Ctx(b"x", partition=1))) is True
            for bad in (1.0, 7, -1, "1"):
                with pytest.raises(ValueError, match=r"is not in 0\.\.1"):
                    await c.submit(_BadPartition(bad))
            with pytest.raises(ValueError):
                c.mount_partitions([5])
        assert payloads(server, 1) == [b"x"]

    run(main())


def test_apply_failure_is_reported_and_applied_again() -> None:
    async def main() -> None:
        server = MockServer(1)
        callbacks = MemoryCallbacks()
        callbacks.fail_next_applies = 1
        async with client(server, callbacks) as c:
            assert await (await c.submit(Ctx(b"t"))) is True
        assert len(callbacks.exceptions) == 1 and callbacks.exceptions[0][:2] == (0, 0)
        assert callbacks.applied[0] == [(0, b"t")]

    run(main())



def test_a_raising_completion_or_application_hook_goes_to_uncaught_exception_and_changes_nothing_else() -> None:
    class Raising(Ctx):
        def on_completion(self, committed: bool) -> None:
            super().on_completion(committed)
            raise ValueError("completion")

        def on_application(self) -> None:
            super().on_application()
            raise KeyError("application")

    async def main() -> None:
        server = MockServer(1)
        events: list[tuple] = []
        callbacks = MemoryCallbacks(events)
        async with client(server, callbacks) as c:
            ctx = Raising(b"r", events=events)
            assert await (await c.submit(ctx)) is True
            assert await (await c.submit(Ctx(b"after"))) is True
        assert [e[0] for e in events[:3]] == ["completion", "apply", "application"]
        assert [(txn, type(exc)) for _, txn, exc in callbacks.exceptions] == [(0, ValueError), (0, KeyError)]
        assert callbacks.applied[0] == [(0, b"r"), (1, b"after")]

    run(main())

def test_generation_bump_remounts_and_later_appends_carry_it() -> None:
    async def main() -> None:
        server = MockServer(1)
        async with client(server) as c:
            assert await (await c.submit(Ctx(b"before"))) is True
            server.bump_generation(0)
            assert await (await c.submit(Ctx(b"after"))) is True
        records = server.records(0)
        assert [r.data for r in records] == [b"before", b"after"]
        assert records[0].req_id.generation == 0 and records[1].req_id.generation == 1

    run(main())


def test_not_ready_partition_is_retried_until_it_mounts() -> None:
    async def main() -> None:
        server = MockServer(1)
        server.set_partition_available(0, False)
        async with client(server) as c:
            submit = asyncio.ensure_future(c.submit(Ctx(b"t")))
            await asyncio.sleep(0.7)  # more than one NOT_READY round (500 ms)
            assert not submit.done()
            server.set_partition_available(0, True)
            assert await (await submit) is True

    run(main())


def test_an_apply_failing_inside_a_feed_batch_is_retried_alone_and_hooks_run_once() -> None:
    class FailThirdOnce(MemoryCallbacks):
        def apply_transaction(self, transaction: Transaction) -> None:
            if transaction.transaction_id == 2 and not self.exceptions:
                raise RuntimeError("application database is down")
            super().apply_transaction(transaction)

    async def main() -> None:
        server = MockServer(1)
        callbacks = FailThirdOnce()
        async with client(server, callbacks) as c:
            await c.wait_mounted()
            server.suspend_feed()
            contexts = [Ctx(b"t%d" % i) for i in range(5)]
            futures = [await c.submit(ctx) for ctx in contexts]
            await eventually(lambda: server.high_water_mark(0) == 4)
            server.resume_feed()  # the five commits arrive in one feed batch
            assert await asyncio.gather(*futures) == [True] * 5
        assert [d for _, d in callbacks.applied[0]] == [ctx.data for ctx in contexts]
        assert [e[:2] for e in callbacks.exceptions] == [(0, 2)]
        for ctx in contexts:
            assert ctx.hooks == [("completion", True), ("application",)]

    run(main())


def test_a_future_the_application_cancels_leaves_its_transaction_and_the_client_unharmed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def main() -> None:
        server = MockServer(1)
        callbacks = MemoryCallbacks()
        async with client(server, callbacks) as c:
            abandoned = await c.submit(Ctx(b"abandoned"))
            abandoned.cancel()
            assert await (await c.submit(Ctx(b"kept"))) is True
            await eventually(lambda: len(callbacks.applied.get(0, [])) == 2)
            assert not c.has_pending_transactions()
        assert sorted(payloads(server)) == [b"abandoned", b"kept"]

    run(main())
    assert not [r for r in caplog.records if r.levelname == "ERROR"]


@pytest.mark.callback_modes("thread")  # its execute blocks
def test_an_execute_ending_while_the_partition_is_unmounted_waits_for_the_mount() -> None:
    async def main() -> None:
        server = MockServer(1)
        async with client(server) as c:
            assert await (await c.submit(Ctx(b"first"))) is True
            release = threading.Event()
            ctx = Ctx(b"second", result=lambda _builder: release.wait(10))
            future = await c.submit(ctx)
            server.set_partition_available(0, False)
            assert server.disconnect(c.client_id) == 1
            await asyncio.sleep(0.1)
            release.set()  # execute ends while the remount is answered NOT_READY
            await asyncio.sleep(0.3)
            assert not future.done()
            server.set_partition_available(0, True)
            assert await future is True
            assert ctx.hooks == [("completion", True), ("application",)]
        assert payloads(server) == [b"first", b"second"]

    run(main())
