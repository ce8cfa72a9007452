"""client.callbackThread false: callbacks and hooks on the event loop (the other tests run in this mode too)."""

import asyncio
import threading

import pytest

from tests.component.client.helpers import FAST, Ctx, MemoryCallbacks, client, run
from waltz_client import MockServer, Transaction, TransactionBuilder, WaltzClient, WaltzError

pytestmark = pytest.mark.callback_modes("loop")


class ThreadRecording(MemoryCallbacks):
    """Records the thread of every apply and context hook (with the event log)."""

    def __init__(self) -> None:
        super().__init__()
        self.threads: set[threading.Thread] = set()

    def apply_transaction(self, transaction: Transaction) -> None:
        self.threads.add(threading.current_thread())
        super().apply_transaction(transaction)


class ThreadCtx(Ctx):
    def __init__(self, data: bytes, threads: set[threading.Thread]) -> None:
        super().__init__(data)
        self.threads = threads

    def execute(self, builder: TransactionBuilder) -> bool:
        self.threads.add(threading.current_thread())
        return super().execute(builder)

    def on_completion(self, committed: bool) -> None:
        self.threads.add(threading.current_thread())
        super().on_completion(committed)

    def on_application(self) -> None:
        self.threads.add(threading.current_thread())
        super().on_application()


def test_callbacks_and_hooks_run_on_the_event_loop_and_no_callback_thread_is_started() -> None:
    async def main() -> None:
        server = MockServer(1)
        callbacks = ThreadRecording()
        before = {t.name for t in threading.enumerate()}
        async with client(server, callbacks) as c:
            contexts = [ThreadCtx(b"t%d" % i, callbacks.threads) for i in range(30)]
            futures = [await c.submit(ctx) for ctx in contexts]
            assert await asyncio.gather(*futures) == [True] * 30
            assert "waltz-callbacks" not in {t.name for t in threading.enumerate()} - before
        assert callbacks.threads == {threading.current_thread()}
        assert all(ctx.hooks == [("completion", True), ("application",)] for ctx in contexts)
        assert [d for _, d in callbacks.applied[0]] == [ctx.data for ctx in contexts]

    run(main())


def test_data_of_another_clients_transaction_is_a_clear_error_in_apply_and_fetchable_outside() -> None:
    async def main() -> None:
        server = MockServer(1)
        reader_callbacks = MemoryCallbacks()
        async with client(server) as writer, client(server, reader_callbacks) as reader:
            assert await (await writer.submit(Ctx(b"theirs")))
            while not reader_callbacks.exceptions:
                await asyncio.sleep(0.01)
            assert await reader.transaction_data(0, 0) == b"theirs"
        _, txn_id, exc = reader_callbacks.exceptions[0]
        assert txn_id == 0 and isinstance(exc, WaltzError) and "client.callbackThread" in str(exc)

    run(main())


def test_the_blocking_client_runs_callbacks_on_its_loop_thread_in_loop_mode() -> None:
    server = MockServer(1)
    callbacks = ThreadRecording()
    with WaltzClient(callbacks, FAST, driver=server) as c:
        assert c.submit(Ctx(b"x")).result(timeout=30)
        c.flush()
    assert {t.name for t in callbacks.threads} == {"waltz-client-loop"}

