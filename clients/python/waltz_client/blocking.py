"""WaltzClient: the blocking Waltz client, an AsyncWaltzClient run on its own event-loop thread."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Coroutine, Iterable, Mapping
from typing import Any, TypeVar

from prometheus_client import CollectorRegistry

from waltz_client.api import TransactionContext, WaltzClientCallbacks
from waltz_client.client import AsyncWaltzClient, ConfigSource
from waltz_client.errors import ForkedClientError, WaltzError, WaltzTimeoutError
from waltz_client.partition_env import Stats

R = TypeVar("R")
_MARGIN_S = 5.0  # the async side bounds its own waits; this only guards against a stuck loop


class WaltzClient:
    """Thread-safe blocking client: `with WaltzClient(callbacks, config) as client: ...`.

    Starts at construction (connects, takes a client id, mounts); config, overrides, metrics_registry: as
    AsyncWaltzClient's.
    Its methods must not be called from inside callbacks or context hooks (they run on the client's callback thread,
    or with client.callbackThread false on its event-loop thread, and would wait for
    themselves): that raises WaltzError.
    """

    def __init__(self, callbacks: WaltzClientCallbacks, config: ConfigSource = None, *, driver: Any = None,
                 metrics_registry: CollectorRegistry | None = None, overrides: Mapping[str, Any] | None = None) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="waltz-client-loop", daemon=True)
        self._thread.start()
        self._closed = False
        try:
            self._client = AsyncWaltzClient(callbacks, config, driver=driver, metrics_registry=metrics_registry,
                                            overrides=overrides)
            cfg = self._client.config
            self._limit = cfg.mount_timeout_s + cfg.request_timeout_s + _MARGIN_S
            self._call(self._client.start(), cfg.zookeeper_connect_timeout_s + self._limit)
        except BaseException:
            self._stop_loop()
            raise

    def __enter__(self) -> WaltzClient:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        self.close(flush=exc_type is None or issubclass(exc_type, Exception))  # not on KeyboardInterrupt

    @property
    def client_id(self) -> int:
        return self._client.client_id

    @property
    def num_partitions(self) -> int:
        """The cluster's number of partitions (what TransactionContext.partition_id is given)."""
        return self._client.num_partitions

    @property
    def cluster_name(self) -> str:
        return self._client.cluster_name

    @property
    def stats(self) -> Stats:
        return self._client.stats

    @property
    def partitions(self) -> list[int]:
        return self._client.partitions

    def submit(self, context: TransactionContext) -> concurrent.futures.Future[bool]:
        """Queue a transaction (waits for capacity); the future ends as AsyncWaltzClient.submit's."""

        async def submit() -> concurrent.futures.Future[bool]:
            result: concurrent.futures.Future[bool] = concurrent.futures.Future()
            _chain(await self._client.submit(context), result)
            return result

        return self._call(submit(), self._limit)

    def submit_and_wait(self, context: TransactionContext, timeout: float | None = None) -> bool:
        """Submit and wait for the outcome, as AsyncWaltzClient.submit_and_wait: True committed and applied (then
        context.committed_transaction_id is its id), False declined; WaltzTimeoutError when timeout (seconds; None: no
        limit) passes first (the transaction goes on: an unknown outcome)."""
        future = self.submit(context)
        try:
            return future.result(timeout)
        except TimeoutError:
            if future.done():
                raise
            raise WaltzTimeoutError(f"the transaction did not end within {timeout:g} s; it goes on") from None

    def wait_applied(self, partition_id: int, transaction_id: int, timeout: float | None = None) -> None:
        """Wait until this client has applied the partition up to transaction_id, as AsyncWaltzClient.wait_applied
        (WaltzTimeoutError after timeout seconds; None: client.requestTimeout)."""
        limit = (self._client.config.request_timeout_s if timeout is None else timeout) + _MARGIN_S
        self._call(self._client.wait_applied(partition_id, transaction_id, timeout), limit)

    def flush(self, timeout: float | None = None) -> None:
        """Wait until every submitted transaction has ended (WaltzTimeoutError after timeout)."""
        limit = (self._client.config.request_timeout_s if timeout is None else timeout) + _MARGIN_S
        self._call(self._client.flush(timeout), limit)

    def high_water_mark(self, partition_id: int) -> int:
        return self._call(self._client.high_water_mark(partition_id), self._limit)

    def client_high_water_mark(self, partition_id: int) -> int:
        return self._client.client_high_water_mark(partition_id)

    def has_pending_transactions(self) -> bool:
        return self._client.has_pending_transactions()

    def wait_mounted(self) -> None:
        """Wait until every partition this client uses is mounted (WaltzTimeoutError)."""
        self._call(self._client.wait_mounted(), self._limit)

    def mount_partitions(self, partition_ids: Iterable[int]) -> None:
        ids = list(partition_ids)

        async def mount() -> None:
            self._client.mount_partitions(ids)

        self._call(mount(), self._limit)

    def close(self, *, flush: bool = True, timeout: float | None = None) -> None:
        """Wait for the transactions in flight to end (flush: at most timeout seconds, None: client.closeTimeout),
        fail what is still pending (WaltzClosedError), stop the client and its thread (idempotent)."""
        if self._closed:
            return
        self._closed = True
        if self._client._forked_from is not None:  # a forked child: the loop thread and connections are the parent's
            return
        wait = (self._client.config.close_timeout_s if timeout is None else timeout) if flush else 0.0
        try:
            self._call(self._client.close(flush=flush, timeout=timeout), wait + self._limit)
        finally:
            self._stop_loop()

    def _call(self, coro: Coroutine[Any, Any, R], timeout: float) -> R:
        client = getattr(self, "_client", None)
        if client is not None and client._forked_from is not None:  # the loop thread stayed in the parent: no wait
            coro.close()
            raise ForkedClientError(client._forked_from)
        if client is not None and client._callback_thread.is_current():
            coro.close()
            raise WaltzError("blocking WaltzClient methods cannot be called from callbacks or context hooks")
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def _stop_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=_MARGIN_S)
        if not self._thread.is_alive():
            self._loop.close()


def _chain(source: asyncio.Future[bool], target: concurrent.futures.Future[bool]) -> None:
    def done(future: asyncio.Future[bool]) -> None:
        if future.cancelled():
            target.cancel()
        elif (exc := future.exception()) is not None:
            target.set_exception(exc)
        else:
            target.set_result(future.result())

    source.add_done_callback(done)
