"""What a web service needs of the client besides submit: read-your-writes across instances (wait_applied and the
id a submit committed as), num_partitions, what cancelling a request's wait does, and the fork guard."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Callable

import pytest

from tests.component.client.helpers import Ctx, MemoryCallbacks, client, eventually, payloads, run
from waltz_client import ForkedClientError, MockServer, WaltzClient, WaltzClosedError, WaltzTimeoutError


@pytest.mark.callback_modes("thread")  # the reader fetches the writer's data
def test_another_instance_waits_until_it_has_applied_what_one_committed() -> None:
    async def main() -> None:
        server = MockServer(2)
        a, b = MemoryCallbacks(), MemoryCallbacks()
        async with client(server, a) as writer, client(server, b) as reader:
            assert writer.num_partitions == reader.num_partitions == 2
            await writer.wait_mounted()
            await reader.wait_mounted()
            server.suspend_feed()  # the reader hears nothing: the writer's commit is not applied there yet
            context = Ctx(b"deposit", partition=1)
            assert context.committed_transaction_id is None
            submitted = asyncio.create_task(writer.submit_and_wait(context))
            await asyncio.sleep(0.2)
            assert not submitted.done()  # its own feed is suspended too: not applied, so not True yet
            waiting = asyncio.create_task(reader.wait_applied(1, 0, timeout=10))
            await asyncio.sleep(0.1)
            assert not waiting.done()
            server.resume_feed()
            assert await submitted is True and context.committed_transaction_id == 0
            await waiting
            assert b.applied[1] == [(0, b"deposit")]
            await reader.wait_applied(1, 0, timeout=0.01)  # applied already: at once
            with pytest.raises(WaltzTimeoutError, match=r"partition 1: transaction 5 was not applied here within "
                                                        r"0\.2 s \(applied up to 0\)"):
                await reader.wait_applied(1, 5, timeout=0.2)
            with pytest.raises(ValueError, match=r"partition id 2 is not in 0\.\.1"):
                await reader.wait_applied(2, 0)
            second = Ctx(b"second", partition=1)
            assert await writer.submit_and_wait(second) is True and second.committed_transaction_id == 1
            await reader.wait_applied(1, 1, timeout=10)
        with pytest.raises(WaltzClosedError):
            await reader.wait_applied(1, 0)

    run(main())


def test_a_wait_for_a_transaction_applied_before_the_client_started_ends_at_once() -> None:
    async def main() -> None:
        server = MockServer(1)
        async with client(server) as c:
            await c.submit_and_wait(Ctx(b"x"))
        async with client(server, MemoryCallbacks(start={0: 0})) as restarted:  # its database holds transaction 0
            await restarted.wait_applied(0, 0, timeout=5)

    run(main())


def test_cancelling_the_task_awaiting_submit_and_wait_does_not_stop_the_append() -> None:
    async def main() -> None:
        server = MockServer(1)
        callbacks = MemoryCallbacks()
        async with client(server, callbacks) as c:
            await c.wait_mounted()
            server.hold_requests()
            request = asyncio.create_task(c.submit_and_wait(Ctx(b"withdraw 10"), timeout=30))
            await eventually(c.has_pending_transactions)
            await asyncio.sleep(0.1)
            request.cancel()  # the HTTP client hung up, or the server's request timeout fired
            with pytest.raises(asyncio.CancelledError):
                await request
            server.release_requests()
            await eventually(lambda: len(callbacks.applied.get(0, [])) == 1)  # committed all the same
            await c.flush()
        assert payloads(server) == [b"withdraw 10"]

    run(main())


def _in_child(check: Callable[[], None]) -> int:
    """Run check in a forked child; its exit status (0: it passed)."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            check()
            code = 0
        except BaseException as exc:  # reported through the exit status
            print(f"child: {type(exc).__name__}: {exc}", file=sys.stderr)
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def test_a_client_used_in_a_forked_child_raises_at_once_and_closing_it_there_leaves_the_parents() -> None:
    async def main() -> None:
        server = MockServer(1)
        callbacks = MemoryCallbacks()
        async with client(server, callbacks) as c:
            assert await c.submit_and_wait(Ctx(b"before"))
            parent = os.getpid()

            def child() -> None:
                message = rf"created in process {parent} before a fork; create a client in each worker after the fork"
                with pytest.raises(ForkedClientError, match=message):
                    asyncio.run(c.submit_and_wait(Ctx(b"from the child")))
                for use in (lambda: c.client_high_water_mark(0), lambda: asyncio.run(c.wait_mounted()),
                            lambda: asyncio.run(c.flush()), lambda: asyncio.run(c.wait_applied(0, 0))):
                    with pytest.raises(ForkedClientError):
                        use()
                asyncio.run(c.close())  # only marks it closed here: the parent's streams are left alone

            assert await asyncio.to_thread(_in_child, child) == 0
            assert await c.submit_and_wait(Ctx(b"after")) is True  # the parent's client goes on
        assert payloads(server) == [b"before", b"after"]

    run(main())


@pytest.mark.callback_modes("thread")
def test_the_blocking_client_in_a_forked_child_raises_at_once_instead_of_waiting_for_its_loop_thread() -> None:
    server = MockServer(1)
    with WaltzClient(MemoryCallbacks(), {"client.mountTimeout": 10, "client.requestTimeout": 20},
                     driver=server) as c:
        assert c.submit_and_wait(Ctx(b"before"), timeout=10)

        def child() -> None:
            with pytest.raises(ForkedClientError):
                c.submit_and_wait(Ctx(b"from the child"), timeout=60)  # would wait for a loop that is not here
            with pytest.raises(ForkedClientError):
                c.wait_applied(0, 0)
            c.close()

        assert _in_child(child) == 0
        assert c.submit_and_wait(Ctx(b"after"), timeout=10)
    assert payloads(server) == [b"before", b"after"]


@pytest.mark.callback_modes("thread")
def test_a_client_made_in_the_child_after_the_fork_works() -> None:
    server_pid = os.getpid()

    def child() -> None:
        assert os.getpid() != server_pid

        async def main() -> None:
            server = MockServer(1)
            async with client(server) as c:
                assert await c.submit_and_wait(Ctx(b"x"))

        run(main())

    async def parent() -> None:
        async with client(MockServer(1)) as c:  # a client open in the parent while the child makes its own
            assert await asyncio.to_thread(_in_child, child) == 0
            assert await c.submit_and_wait(Ctx(b"y"))

    run(parent())
