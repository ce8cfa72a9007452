"""CallbackThread: calls made while the thread is busy run together, in order, on its one thread."""

import asyncio
import subprocess
import sys
import textwrap
import threading

import pytest

from waltz_client import tasks
from waltz_client.tasks import CallbackThread, Job, LoopCallbacks, callback_runner


@pytest.fixture
def batches(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The size of every batch the callback thread runs, in order."""
    sizes: list[int] = []
    original = tasks._run_batch

    def counting(batch: list, *urgent: object) -> list:
        sizes.append(len(batch))
        return original(batch, *urgent)

    monkeypatch.setattr(tasks, "_run_batch", counting)
    return sizes


def test_calls_waiting_together_run_as_one_batch_in_order_with_their_own_results(batches: list[int]) -> None:
    thread = CallbackThread("test-callbacks")
    ran: list[tuple[int, threading.Thread]] = []
    release = threading.Event()

    def record(i: int) -> int:
        if i == 7:
            raise ValueError("seven")
        ran.append((i, threading.current_thread()))
        return i * 10

    async def main() -> None:
        first = asyncio.ensure_future(thread.call(release.wait))
        await asyncio.sleep(0.05)  # the thread is now busy with `first`
        calls = [asyncio.ensure_future(thread.call(record, i)) for i in range(20)]
        await asyncio.sleep(0.05)
        release.set()
        assert await first is True
        results = await asyncio.gather(*calls, return_exceptions=True)
        assert [r for i, r in enumerate(results) if i != 7] == [i * 10 for i in range(20) if i != 7]
        assert isinstance(results[7], ValueError)

    try:
        asyncio.run(main())
    finally:
        thread.shutdown()
    assert [i for i, _ in ran] == [i for i in range(20) if i != 7]
    assert {t for _, t in ran} == {ran[0][1]} and ran[0][1] is not threading.current_thread()
    assert batches == [1, 20]


def test_a_call_after_shutdown_raises() -> None:
    thread = CallbackThread("test-callbacks")
    thread.shutdown()

    async def main() -> None:
        with pytest.raises(RuntimeError):
            await thread.call(lambda: None)

    asyncio.run(main())


class RecordingJob(Job):
    """Runs on the thread (work(i)); done() records the outcome, on which thread, and when all are in."""

    def __init__(self, i: int, heard: list[tuple[int, bool, object, threading.Thread]], expected: int = 1) -> None:
        self.i, self.heard, self.expected = i, heard, expected
        self.all_heard = asyncio.Event()
        self.ran_on: threading.Thread | None = None

    def run(self) -> int:
        self.ran_on = threading.current_thread()
        if self.i == 3:
            raise ValueError("three")
        return self.i * 10

    def done(self, ok: bool, value: object) -> None:
        self.heard.append((self.i, ok, value, threading.current_thread()))
        if len(self.heard) == self.expected:
            self.all_heard.set()


@pytest.mark.parametrize("threaded", [True, False], ids=["thread", "loop"])
def test_jobs_scheduled_in_one_loop_iteration_share_one_batch_and_each_hears_its_outcome(
    batches: list[int], threaded: bool,
) -> None:
    thread = callback_runner(threaded, "test-callbacks")
    heard: list[tuple[int, bool, object, threading.Thread]] = []
    jobs = [RecordingJob(i, heard, expected=6) for i in range(6)]

    async def main() -> None:
        for job in jobs:
            thread.schedule(job)
        assert heard == []  # never from inside schedule()
        await jobs[-1].all_heard.wait()

    try:
        asyncio.run(main())
    finally:
        thread.shutdown()
    assert batches == [6]
    assert [(i, ok) for i, ok, _, _ in heard] == [(i, i != 3) for i in range(6)]
    assert [v for i, _, v, _ in heard if i != 3] == [0, 10, 20, 40, 50]
    assert isinstance(heard[3][2], ValueError)
    assert {t for *_, t in heard} == {threading.main_thread()}
    assert {job.ran_on for job in jobs} == {thread._thread if threaded else threading.main_thread()}


class BatchJob(RecordingJob):
    """Finishes a batch of its own jobs in one done_all call, recorded."""

    batches: list[list[int]] = []

    @classmethod
    def done_all(cls, jobs: list[Job], values: list[object]) -> None:
        cls.batches.append([job.i for job in jobs])  # type: ignore[attr-defined]
        super().done_all(jobs, values)


@pytest.mark.parametrize("threaded", [True, False], ids=["thread", "loop"])
def test_a_batch_of_one_job_class_is_finished_by_its_done_all_a_mixed_one_run_of_a_class_at_a_time(
    batches: list[int], threaded: bool,
) -> None:
    thread = callback_runner(threaded, "test-callbacks")
    heard: list[tuple[int, bool, object, threading.Thread]] = []
    BatchJob.batches = []

    async def main() -> None:
        alone = [BatchJob(i, heard, expected=4) for i in (0, 1, 2, 3)]
        for job in alone:
            thread.schedule(job)
        await alone[-1].all_heard.wait()
        mixed = [BatchJob(4, heard, 8), RecordingJob(5, heard, 8), BatchJob(6, heard, 8), BatchJob(7, heard, 8)]
        for each in mixed:
            thread.schedule(each)
        await mixed[-1].all_heard.wait()
        again = BatchJob(8, heard, 9)  # the batch after a mixed one starts afresh
        thread.schedule(again)
        await again.all_heard.wait()

    try:
        asyncio.run(main())
    finally:
        thread.shutdown()
    # a mixed batch: each run of consecutive jobs of one class by its class's done_all, in order (issue 31: a feed
    # apply scheduled first among submissions no longer makes them append one by one)
    assert batches == [4, 4, 1] and BatchJob.batches == [[0, 1, 2, 3], [4], [6, 7], [8]]
    assert [(i, ok) for i, ok, _, _ in heard] == [(i, i != 3) for i in range(9)]


def test_a_job_scheduled_after_shutdown_is_refused_through_done() -> None:
    thread = CallbackThread("test-callbacks")
    thread.shutdown()
    heard: list[tuple[int, bool, object, threading.Thread]] = []
    job = RecordingJob(1, heard)

    async def main() -> None:
        thread.schedule(job)
        await asyncio.wait_for(job.all_heard.wait(), 1)

    asyncio.run(main())
    assert job.ran_on is None and heard[0][1] is False and isinstance(heard[0][2], RuntimeError)


def test_at_interpreter_exit_a_thread_never_shut_down_finishes_its_job_and_lets_the_process_end() -> None:
    script = textwrap.dedent("""
        import asyncio, time
        from waltz_client.tasks import CallbackThread
        thread = CallbackThread("never-shut-down")
        def slow():
            time.sleep(0.2)
            print("job finished", flush=True)
        async def main():
            asyncio.ensure_future(thread.call(slow))
            await asyncio.sleep(0.05)
        asyncio.run(main())
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0 and done.stdout.strip() == "job finished", done.stderr


# ---- LoopCallbacks (client.callbackThread: false): the same batching, on the event loop -----------------


def test_in_loop_mode_the_current_thread_is_the_loops_once_a_batch_ran_there() -> None:
    runner = LoopCallbacks()

    async def main() -> None:
        assert not runner.is_current()  # no batch ran yet
        assert await runner.call(runner.is_current) is True
        assert runner.is_current() and await asyncio.to_thread(runner.is_current) is False

    asyncio.run(main())


def test_in_loop_mode_calls_run_in_order_with_their_own_results_and_a_cancelled_one_never_runs(
    batches: list[int],
) -> None:
    runner = LoopCallbacks()
    ran: list[int] = []

    def record(i: int) -> int:
        ran.append(i)
        if i == 7:
            raise ValueError("seven")
        return i * 10

    async def main() -> None:
        calls = [asyncio.ensure_future(runner.call(record, i)) for i in range(10)]  # each call() schedules its job
        calls[4].cancel()  # before the batch starts (the loop's next iteration)
        results = await asyncio.gather(*calls, return_exceptions=True)
        assert [r for i, r in enumerate(results) if i not in (4, 7)] == [i * 10 for i in range(10) if i not in (4, 7)]
        assert isinstance(results[4], asyncio.CancelledError) and isinstance(results[7], ValueError)

    asyncio.run(main())
    assert ran == [i for i in range(10) if i != 4]
    assert batches == [9]


def test_in_loop_mode_jobs_scheduled_while_a_batch_finishes_run_in_the_next_batch(batches: list[int]) -> None:
    runner = LoopCallbacks()
    heard: list[tuple[int, bool, object, threading.Thread]] = []

    class Chained(RecordingJob):
        def done(self, ok: bool, value: object) -> None:
            super().done(ok, value)
            if self.i < 2:  # from inside the batch's done_all: never run inside it
                runner.schedule(Chained(self.i + 10, heard, expected=3))
                runner.schedule(Chained(self.i + 20, heard, expected=3))

    async def main() -> None:
        runner.schedule(Chained(0, heard))
        while len(heard) < 3:
            await asyncio.sleep(0)

    asyncio.run(main())
    assert [i for i, *_ in heard] == [0, 10, 20]
    assert batches == [1, 2]


def test_in_loop_mode_jobs_pending_at_shutdown_and_after_it_are_refused_and_never_run(batches: list[int]) -> None:
    runner = LoopCallbacks()
    heard: list[tuple[int, bool, object, threading.Thread]] = []
    pending = [RecordingJob(i, heard, expected=3) for i in range(2)]

    async def main() -> None:
        for job in pending:
            runner.schedule(job)  # waiting for the next iteration
        runner.shutdown()
        later = RecordingJob(2, heard, expected=3)
        runner.schedule(later)
        await asyncio.wait_for(later.all_heard.wait(), 1)
        with pytest.raises(RuntimeError):
            await runner.call(lambda: None)

    asyncio.run(main())
    assert batches == []  # nothing ran
    assert all(job.ran_on is None for job in pending)
    assert [(i, ok) for i, ok, _, _ in heard] == [(0, False), (1, False), (2, False)]
    assert all(isinstance(value, RuntimeError) for _, _, value, _ in heard)


def test_in_loop_mode_a_job_shutting_the_runner_down_lets_its_batch_finish() -> None:
    runner = LoopCallbacks()
    ran: list[int] = []

    def work(i: int) -> int:
        if i == 1:
            runner.shutdown()  # as a callback closing the client would (the thread mode lets its batch end too)
        ran.append(i)
        return i

    async def main() -> list[object]:
        return await asyncio.gather(*(runner.call(work, i) for i in range(3)), return_exceptions=True)

    assert asyncio.run(main()) == [0, 1, 2] and ran == [0, 1, 2]


def test_callback_runner_picks_the_thread_or_the_loop() -> None:
    threaded = callback_runner(True, "test-callbacks")
    try:
        assert type(threaded) is CallbackThread and threaded._thread.name == "test-callbacks"
    finally:
        threaded.shutdown()
    assert type(callback_runner(False, "unused")) is LoopCallbacks


def test_a_post_first_while_a_batch_runs_runs_between_two_of_its_jobs(batches: list[int]) -> None:
    """(A lock failure's hook: it waits for the job running, not for the rest of the batch.) One posted after the
    thread's last look at them leads the next batch."""
    thread = CallbackThread("test-callbacks")
    ran: list[str] = []
    release = threading.Event()

    def blocks() -> None:
        release.wait(10)
        ran.append("blocker")

    async def main() -> None:
        calls = [asyncio.ensure_future(thread.call(blocks))]
        calls += [asyncio.ensure_future(thread.call(ran.append, f"job {i}")) for i in range(3)]
        await asyncio.sleep(0.05)  # the four run as one batch: the thread is in the first
        thread.post_first(ran.append, "urgent")
        release.set()
        await asyncio.gather(*calls)
        thread.post_first(ran.append, "later")  # nothing runs: the next batch
        await thread.call(ran.append, "last")

    try:
        asyncio.run(main())
    finally:
        thread.shutdown()
    assert ran == ["blocker", "urgent", "job 0", "job 1", "job 2", "later", "last"]
    assert batches == [4, 2]
