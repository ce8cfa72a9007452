"""The client behaves like a Python library (issue 35): a failing apply is what the mount raises, close flushes what
is in flight, no future is left unretrieved, lock failures log at DEBUG, the catch-up metric is true from the first
moment, a YAML path takes overrides, and the package exports what the docs use."""

from __future__ import annotations

import asyncio
import gc
import logging
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from tests.component.client.helpers import FAST, Ctx, MemoryCallbacks, client, eventually, payloads, run
from waltz_client import (
    ApplyError,
    AsyncWaltzClient,
    MockServer,
    PartitionLocalLock,
    Transaction,
    WaltzClient,
    WaltzClosedError,
    WaltzTimeoutError,
)
from waltz_client.config import ClientConfig


async def _fill(server: MockServer, count: int, partition: int = 0) -> None:
    async with client(server) as writer:
        for i in range(count):
            await writer.submit_and_wait(Ctx(b"t%d" % i, partition=partition))


class _Broken(MemoryCallbacks):
    """apply_transaction raises KeyError until `healed`."""

    healed = False

    def apply_transaction(self, transaction: Transaction) -> None:
        if not self.healed:
            raise KeyError("customer 17")
        super().apply_transaction(transaction)


@pytest.mark.callback_modes("thread")  # the applies fetch the other client's data
def test_a_failing_apply_is_what_the_mount_and_submit_raise_not_a_timeout() -> None:
    server = MockServer(1)

    async def scenario() -> tuple[BaseException, BaseException, float, int]:
        await _fill(server, 3)
        callbacks = _Broken()
        async with AsyncWaltzClient(callbacks, {**FAST, "client.mountTimeout": 0.5}, driver=server) as reader:
            started = time.monotonic()
            with pytest.raises(ApplyError) as mounting:
                await reader.wait_mounted()
            waited = time.monotonic() - started
            with pytest.raises(ApplyError) as submitting:
                await reader.submit(Ctx(b"new"))
            callbacks.healed = True  # the client goes on retrying the apply (backoff): the mount then completes
            await eventually(lambda: reader.client_high_water_mark(0) == 2)
            await reader.wait_mounted()
            await reader.submit_and_wait(Ctx(b"new"))
            return mounting.value, submitting.value, waited, reader.client_high_water_mark(0)

    mounting, submitting, waited, hwm = run(scenario())
    for raised in (mounting, submitting):
        assert isinstance(raised.__cause__, KeyError) and raised.error is raised.__cause__
        assert not isinstance(raised, WaltzTimeoutError) and raised.retriable
        assert str(raised).startswith("partition 0: applying transaction 0 failed: KeyError: 'customer 17'"), raised
    assert 0.45 < waited < 10  # after client.mountTimeout: a failure that passes within it is waited through
    assert hwm == 3


@pytest.mark.parametrize("blocking", [False, True], ids=["async", "blocking"])
def test_close_flushes_what_is_in_flight(blocking: bool) -> None:
    server = MockServer(1)
    server.set_max_delay(0.3)  # each append waits up to 0.3 s at the server: still in flight when the client closes
    if blocking:
        with WaltzClient(MemoryCallbacks(), FAST, driver=server) as blocking_client:
            futures = [blocking_client.submit(Ctx(b"b%d" % i)) for i in range(5)]
            with pytest.raises(WaltzTimeoutError):
                blocking_client.submit_and_wait(Ctx(b"last"), timeout=0.0001)
        assert all(f.result(0) for f in futures)
    else:
        async def scenario() -> None:
            async with client(server) as c:
                for i in range(5):
                    await c.submit(Ctx(b"b%d" % i))
                with pytest.raises(WaltzTimeoutError):
                    await c.submit_and_wait(Ctx(b"last"), timeout=0.0001)

        run(scenario())
    assert sorted(payloads(server)) == sorted([b"b%d" % i for i in range(5)] + [b"last"])


def test_close_without_flushing_fails_what_is_pending_and_leaves_no_unretrieved_future(
        caplog: pytest.LogCaptureFixture) -> None:
    server = MockServer(1)
    reported: list[str] = []

    async def scenario() -> tuple[list[BaseException], list[tuple[str, Any]]]:
        asyncio.get_running_loop().set_exception_handler(lambda _, context: reported.append(context["message"]))
        ctx = Ctx(b"never")
        async with client(server) as c:
            await c.wait_mounted()
            server.hold_requests()  # nothing commits now: everything submitted is pending at close
            with pytest.raises(WaltzTimeoutError):
                await c.submit_and_wait(ctx, timeout=0.0001)  # its future is the client's own: nobody awaits it
            kept = await c.submit(Ctx(b"kept"))
            await c.close(flush=False)
        results = list(await asyncio.gather(kept, return_exceptions=True))
        del kept
        gc.collect()
        await asyncio.sleep(0.05)
        return results, ctx.hooks

    with caplog.at_level(logging.ERROR, logger="asyncio"):
        results, hooks = run(scenario())
    gc.collect()
    assert [type(r) for r in results] == [WaltzClosedError]  # a future the application holds still says so
    assert [type(h[1]) for h in hooks if h[0] == "exception"] == [WaltzClosedError]
    assert not [m for m in reported if "never retrieved" in m], reported
    assert "never retrieved" not in caplog.text


def test_close_gives_up_flushing_after_its_timeout() -> None:
    server = MockServer(1)

    async def scenario() -> tuple[float, BaseException | bool]:
        c = client(server, **{"client.closeTimeout": 0.5})
        await c.start()
        await c.wait_mounted()
        server.hold_requests()
        future = await c.submit(Ctx(b"held"))
        started = time.monotonic()
        await c.close()
        elapsed = time.monotonic() - started
        try:
            return elapsed, await future
        except WaltzClosedError as exc:
            return elapsed, exc

    elapsed, outcome = run(scenario())
    assert isinstance(outcome, WaltzClosedError)
    assert 0.4 < elapsed < 5


@pytest.mark.callback_modes("thread")
def test_lock_failures_log_at_debug_and_count_in_their_metric(caplog: pytest.LogCaptureFixture) -> None:
    server = MockServer(1)
    lock = PartitionLocalLock("row", 7)

    async def scenario() -> dict[str, int]:
        async with client(server) as c:
            server.force_next_lock_fail(3)
            assert await c.submit_and_wait(Ctx(b"x", write=[lock]))
            return c.metric_counters()

    with caplog.at_level(logging.DEBUG, logger="waltz_client"):
        counters = run(scenario())
    assert counters["waltz_client_lock_failures"] == 3
    retries = [r for r in caplog.records if "executing it again" in r.getMessage()]
    assert len(retries) == 3 and {r.levelno for r in retries} == {logging.DEBUG}
    assert not [r for r in caplog.records if r.levelno >= logging.INFO and "lock" in r.getMessage()]


class _SlowApply(MemoryCallbacks):
    def apply_transaction(self, transaction: Transaction) -> None:
        time.sleep(0.005)
        super().apply_transaction(transaction)


@pytest.mark.callback_modes("thread")  # its applies block
def test_the_catch_up_metric_is_never_zero_while_the_partition_is_not_mounted() -> None:
    server = MockServer(1)
    server.feed_batch_size = 10
    registry = CollectorRegistry()
    seen: list[tuple[bool, int, int]] = []  # (mounted, remaining, client high-water mark) per scrape

    async def scenario() -> None:
        await _fill(server, 300)
        reader = AsyncWaltzClient(_SlowApply(), FAST, driver=server, metrics_registry=registry)
        stop = threading.Event()

        def scrape() -> None:
            while not stop.is_set():
                for p in reader.metric_partitions():
                    seen.append((p.mounted, p.catchup_remaining, p.client_high_water_mark))
                time.sleep(0.005)

        async with reader:
            scraper = threading.Thread(target=scrape, daemon=True)
            scraper.start()
            try:
                await reader.wait_mounted()
            finally:
                stop.set()
                scraper.join(5)
            seen.extend((p.mounted, p.catchup_remaining, p.client_high_water_mark) for p in reader.metric_partitions())

    run(scenario())
    unmounted = [(remaining, hwm) for mounted, remaining, hwm in seen if not mounted]
    assert unmounted and seen[-1][:2] == (True, 0)
    # -1 (the target not known yet) or the truth, from the start: never 0 while transactions are still to apply
    assert all(remaining == -1 or remaining == 299 - hwm for remaining, hwm in unmounted), unmounted[:20]
    early = [remaining for remaining, hwm in unmounted if hwm < 100]
    assert early and early.count(-1) < len(early) and max(early) > 200, early[:20]


@pytest.mark.callback_modes("thread")  # no client callbacks run: one mode is enough
def test_a_yaml_path_takes_overrides_and_so_does_the_client(tmp_path: Path) -> None:
    path = tmp_path / "client.yaml"
    path.write_text("client:\n  mountTimeout: 7\n  requestTimeout: 9\n")
    config = ClientConfig.of(path, zookeeper_required=False, overrides={"client.mountTimeout": 3,
                                                                        "client": {"maxRetries": 4}})
    assert (config.mount_timeout_s, config.request_timeout_s, config.max_retries) == (3.0, 9.0, 4)
    mapping = ClientConfig.of({"client.mountTimeout": 7}, zookeeper_required=False,
                              overrides={"client.mountTimeout": 2})
    assert mapping.mount_timeout_s == 2.0
    c = AsyncWaltzClient(MemoryCallbacks(), path, driver=MockServer(1), overrides={"client.requestTimeout": 4})
    assert (c.config.mount_timeout_s, c.config.request_timeout_s) == (7.0, 4.0)


@pytest.mark.callback_modes("thread")  # no client callbacks run: one mode is enough
def test_the_package_exports_what_the_docs_use_without_needing_psycopg() -> None:
    import waltz_client

    names = ["ApplyError", "PartialApplyError", "JsonSerializer", "SqliteClientCallbacks", "GuardedConnection",
             "ForbiddenCallError", "PostgresClientCallbacks", "PgGuardedConnection", "DatabaseUnavailableError",
             "AsyncPostgresClientCallbacks", "AsyncPgGuardedConnection"]
    for name in names:
        assert getattr(waltz_client, name).__name__ == name
        assert name in dir(waltz_client)
    with pytest.raises(AttributeError):
        waltz_client.NoSuchThing  # noqa: B018
    # importing the client (and `import *`) does not import psycopg, which only the postgres extra installs
    code = ("import sys; from waltz_client import *; import waltz_client; "
            "assert 'psycopg' not in sys.modules, 'psycopg imported'; print(len(waltz_client.__all__))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


@pytest.mark.callback_modes("thread")  # no client callbacks run: one mode is enough
def test_a_helper_subclass_implements_apply_or_apply_batch_or_both(tmp_path: Path) -> None:
    from waltz_client import AsyncPostgresClientCallbacks, GuardedConnection, PostgresClientCallbacks
    from waltz_client import SqliteClientCallbacks as Sqlite

    class OnlyBatch(Sqlite):
        def create_schema(self, connection: Any) -> None:
            connection.execute("CREATE TABLE IF NOT EXISTS rows (id INTEGER PRIMARY KEY)")

        def apply_batch(self, transactions: Sequence[Transaction], connection: GuardedConnection) -> None:
            connection.executemany("INSERT INTO rows VALUES (?)", [(t.transaction_id,) for t in transactions])

    class Neither(Sqlite):
        pass

    class AsyncOnlyBatch(AsyncPostgresClientCallbacks):
        async def apply_batch(self, transactions: Sequence[Transaction], connection: Any) -> None:
            pass

    class PgNeither(PostgresClientCallbacks):
        pass

    helper = OnlyBatch(tmp_path / "app.db")  # was: TypeError: Can't instantiate abstract class ... method apply
    helper.apply_transactions([Transaction(0, i, None, 0, lambda: b"") for i in range(3)])  # type: ignore[arg-type]
    assert helper.query_all("SELECT id FROM rows") == [(0,), (1,), (2,)]
    helper.close()
    AsyncOnlyBatch("host=nowhere")  # connects only when opened
    for neither in (Neither, PgNeither):
        with pytest.raises(TypeError, match=r"implement apply\(\) .* or apply_batch\(\)"):
            neither(str(tmp_path / "other.db"))  # refused before connecting to anything


def test_leaving_with_an_exception_still_flushes_but_a_cancellation_does_not_wait() -> None:
    server = MockServer(1)

    async def scenario() -> float:
        c = client(server, **{"client.closeTimeout": 30})
        await c.start()
        await c.wait_mounted()
        server.hold_requests()
        await c.submit(Ctx(b"held"))
        started = time.monotonic()
        await c.__aexit__(asyncio.CancelledError, asyncio.CancelledError(), None)
        return time.monotonic() - started

    assert run(scenario()) < 5
    released = MockServer(1)

    async def failing() -> None:
        async with client(released) as c:
            await c.submit(Ctx(b"sent"))
            raise ValueError("the application's own error")

    with pytest.raises(ValueError):
        run(failing())
    assert payloads(released) == [b"sent"]


def test_a_helper_whose_batches_are_the_clients_per_transaction_default_applies_without_recursing(
        tmp_path: Path) -> None:
    """bench.catchup's per-transaction baseline sets apply_transactions to WaltzClientCallbacks' default (which calls
    apply_transaction for each); the shared batch-apply base's apply_transaction called apply_transactions back, and
    the two recursed until RecursionError, retried for ever (found by test_bench_catchup after the merge)."""
    from waltz_client import GuardedConnection, WaltzClientCallbacks
    from waltz_client import SqliteClientCallbacks as Sqlite

    class PerTransaction(Sqlite):
        apply_transactions = WaltzClientCallbacks.apply_transactions

        def create_schema(self, connection: Any) -> None:
            connection.execute("CREATE TABLE IF NOT EXISTS rows (id INTEGER PRIMARY KEY)")

        def apply(self, transaction: Transaction, connection: GuardedConnection) -> None:
            connection.execute("INSERT INTO rows VALUES (?)", (transaction.transaction_id,))

    helper = PerTransaction(tmp_path / "app.db")
    helper.apply_transactions([Transaction(0, i, None, 0, lambda: b"") for i in range(3)])  # type: ignore[arg-type]
    assert helper.query_all("SELECT id FROM rows") == [(0,), (1,), (2,)]
    assert helper.get_client_high_water_mark(0) == 2
    helper.close()
