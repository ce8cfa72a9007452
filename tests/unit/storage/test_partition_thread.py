"""PartitionThread: calls and stream requests run in queue order on one thread; results, errors and cancellation
reach the loop; stream requests queued together are served as one run."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import cast

import pytest

from waltz_storage.dispatch import Answerable, Answers, StreamRequest
from waltz_storage.node import PartitionThread, WorkCount


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


def test_stream_requests_queued_together_are_served_as_one_run_in_order_between_calls():
    release = threading.Event()
    runs: list[list[int]] = []
    work = WorkCount()

    def serve(run: list[StreamRequest]) -> list[Answers]:
        runs.append([r.msg for r in run])
        return []

    thread = PartitionThread("partition-test", serve, work)

    def request(i: int) -> StreamRequest:
        return StreamRequest("append", i, cast(Answerable, None))

    async def scenario() -> None:
        held = thread.submit(release.wait, ())
        for i in range(3):
            thread.post(request(i))
        between = thread.submit(lambda: [list(run) for run in runs], ())
        thread.post(request(3))
        assert work.value == 6
        release.set()
        await held
        assert await between == [[0, 1, 2]]  # the call ran after the run queued before it, before the next

    try:
        asyncio.run(scenario())
    finally:
        thread.shutdown()
    assert runs == [[0, 1, 2], [3]] and work.value == 0


def test_shutdown_behind_stream_requests_serves_them_first_and_a_failing_serve_does_not_stop_the_thread():
    release = threading.Event()
    served: list[int] = []

    def serve(run: list[StreamRequest]) -> list[Answers]:
        served.extend(r.msg for r in run)
        if 0 in served and len(served) == 1:
            raise RuntimeError("a bug in serve")
        return []

    work = WorkCount()
    thread = PartitionThread("partition-test", serve, work)

    async def scenario() -> None:
        thread.post(StreamRequest("append", 0, cast(Answerable, None)))
        await thread.submit(release.wait, (0.01,))  # after the failing run: the thread lives on
        thread.submit(release.wait, ())
        thread.post(StreamRequest("append", 1, cast(Answerable, None)))
        closing = asyncio.get_running_loop().run_in_executor(None, thread.shutdown)
        await asyncio.sleep(0.05)
        release.set()
        await closing

    asyncio.run(scenario())
    assert served == [0, 1] and work.value == 0


def test_each_group_is_counted_done_before_its_answers_go_to_the_stream():
    work = WorkCount()
    seen: list[tuple[int, int, list[str]]] = []

    class Stream:
        def answer(self, partition_id: int, responses: list[str]) -> None:
            seen.append((work.value, partition_id, responses))

    stream = Stream()

    def serve(run: list[StreamRequest]) -> Iterator[Answers]:
        yield Answers(stream, 7, ["a", "b"])
        yield Answers(stream, 7, ["c"])

    thread = PartitionThread("partition-test", serve, work)
    release = threading.Event()

    async def scenario() -> None:
        held = thread.submit(release.wait, ())
        for i in range(3):
            thread.post(StreamRequest("append", i, stream))
        release.set()
        await held

    try:
        asyncio.run(scenario())
    finally:
        thread.shutdown()
    assert seen == [(1, 7, ["a", "b"]), (0, 7, ["c"])] and work.value == 0
