"""PartitionThread: calls run in submission order on one thread; results, errors and cancellation reach the loop."""

from __future__ import annotations

import asyncio
import threading

import pytest

from waltz_storage.node import PartitionThread


def test_calls_run_in_order_on_one_thread_and_answer_their_awaiters():
    thread = PartitionThread("partition-test")
    seen: list[tuple[int, str]] = []

    def work(i: int) -> int:
        seen.append((i, threading.current_thread().name))
        if i == 3:
            raise ValueError("three")
        return i * 10

    async def scenario() -> list[object]:
        futures = [thread.submit(work, (i,)) for i in range(6)]
        futures[4].cancel()  # its awaiter goes away; the call still runs, and nothing breaks
        return await asyncio.gather(*futures, return_exceptions=True)

    try:
        answers = asyncio.run(scenario())
    finally:
        thread.shutdown()
    assert answers[:3] == [0, 10, 20] and answers[5] == 50
    assert isinstance(answers[3], ValueError) and isinstance(answers[4], asyncio.CancelledError)
    assert seen == [(i, "partition-test") for i in range(6)]


def test_shutdown_finishes_what_was_submitted_then_refuses_more():
    thread = PartitionThread("partition-test")
    release = threading.Event()
    done: list[int] = []

    async def scenario() -> None:
        thread.submit(release.wait, ())
        thread.submit(done.append, (1,))
        closing = asyncio.get_running_loop().run_in_executor(None, thread.shutdown)
        await asyncio.sleep(0.05)
        with pytest.raises(RuntimeError, match="shut down"):
            thread.submit(done.append, (2,))
        release.set()
        await closing

    asyncio.run(scenario())
    assert done == [1]
