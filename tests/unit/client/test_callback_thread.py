"""CallbackThread: calls made while the thread is busy run together, in order, on its one thread."""

import asyncio
import threading

import pytest

from waltz_client import tasks
from waltz_client.tasks import CallbackThread


@pytest.fixture
def batches(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The size of every batch the callback thread runs, in order."""
    sizes: list[int] = []
    original = tasks._run_batch

    def counting(batch: list) -> list:
        sizes.append(len(batch))
        return original(batch)

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


def test_calls_made_in_one_loop_iteration_share_one_batch_and_done_callables_hear_each_outcome(
    batches: list[int],
) -> None:
    thread = CallbackThread("test-callbacks")
    heard: list[tuple[int, bool, object, threading.Thread]] = []

    def work(i: int) -> int:
        if i == 3:
            raise ValueError("three")
        return i * 10

    async def main() -> None:
        done = asyncio.Event()
        for i in range(6):
            def record(ok: bool, value: object, i: int = i) -> None:
                heard.append((i, ok, value, threading.current_thread()))
                if len(heard) == 6:
                    done.set()
            thread.schedule(work, (i,), record)
        assert heard == []  # never from inside schedule()
        await done.wait()

    try:
        asyncio.run(main())
    finally:
        thread.shutdown()
    assert batches == [6]
    assert [(i, ok) for i, ok, _, _ in heard] == [(i, i != 3) for i in range(6)]
    assert [v for i, _, v, _ in heard if i != 3] == [0, 10, 20, 40, 50]
    assert isinstance(heard[3][2], ValueError)
    assert {t for *_, t in heard} == {threading.main_thread()}


def test_a_call_scheduled_after_shutdown_is_refused_through_its_done_callable() -> None:
    thread = CallbackThread("test-callbacks")
    thread.shutdown()
    heard: list[tuple[bool, object]] = []

    async def main() -> None:
        thread.schedule(lambda: 1, (), lambda ok, value: heard.append((ok, value)))
        await asyncio.sleep(0.01)

    asyncio.run(main())
    assert len(heard) == 1 and heard[0][0] is False and isinstance(heard[0][1], RuntimeError)
