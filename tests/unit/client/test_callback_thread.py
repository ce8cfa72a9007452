"""CallbackThread: calls made while the thread is busy run together, in order, on its one thread."""

import asyncio
import threading

import pytest

from waltz_client import tasks
from waltz_client.tasks import CallbackThread


def test_calls_waiting_together_run_as_one_batch_in_order_with_their_own_results(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    batches: list[int] = []
    original = tasks._run_batch

    def counting(batch: list) -> list:
        batches.append(len(batch))
        return original(batch)

    monkeypatch.setattr(tasks, "_run_batch", counting)
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
