"""A storage node at run time: the engine, one worker thread per partition, and orderly shutdown."""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol, TypeVar

import grpc

from waltz_storage.dispatch import Limits, RequestExecutor
from waltz_storage.errors import ClusterKeyMismatch, PartitionCountMismatch
from waltz_storage.metrics import StorageMetrics
from waltz_storage.storage_manager import StorageManager

T = TypeVar("T")

log = logging.getLogger(__name__)


class Stoppable(Protocol):
    def stop(self) -> None: ...


def _settle(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if future.cancelled():
        return  # whoever waited has gone; the work is done all the same
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


class PartitionThread:
    """A thread that runs calls in the order they were submitted and settles each one's future on its loop.

    Cheaper per call than run_in_executor on a ThreadPoolExecutor (no concurrent Future, no chaining of two
    futures): a SimpleQueue in, one call_soon_threadsafe out. A call runs even if its awaiter is cancelled.
    """

    def __init__(self, name: str) -> None:
        self._calls: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._closed = False
        self._lock = threading.Lock()  # nothing is submitted behind the end marker
        self._thread = threading.Thread(target=self._work, name=name, daemon=True)
        self._thread.start()

    def submit(self, fn: Callable[..., T], args: tuple[Any, ...]) -> asyncio.Future[T]:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        with self._lock:
            if self._closed:
                raise RuntimeError("the partition thread is shut down")
            self._calls.put((loop, future, fn, args))
        return future

    def shutdown(self) -> None:
        """Run what was submitted, then stop the thread."""
        with self._lock:
            self._closed = True
            self._calls.put(None)
        self._thread.join()

    def _work(self) -> None:
        while (call := self._calls.get()) is not None:
            loop, future, fn, args = call
            result, error = None, None
            try:
                result = fn(*args)
            except BaseException as e:  # handed to the awaiter, as run_in_executor would
                error = e
            try:
                loop.call_soon_threadsafe(_settle, future, result, error)
            except RuntimeError:  # the loop is closed: nobody is waiting any more
                pass
            del call, future, result, error


class StorageNode:
    """Owns the StorageManager; every operation on a partition runs on that partition's single thread.

    One thread per partition keeps each partition's requests in order, from every stream and the
    admin port alike, while blocking file I/O and fsync stay off the event loop and partitions never
    wait for each other.
    """

    def __init__(self, manager: StorageManager, limits: Limits, metrics: StorageMetrics | None = None) -> None:
        self.manager = manager
        self.metrics = metrics or StorageMetrics()
        self.executor = RequestExecutor(manager, limits, self.metrics)
        self.stopping = False
        self._threads: dict[int, PartitionThread] = {}
        self._streams: set[Stoppable] = set()

    @classmethod
    def open(
        cls,
        directory: Path | str,
        cluster_key: uuid.UUID,
        num_partitions: int,
        *,
        limits: Limits,
        segment_size_threshold: int,
        metrics: StorageMetrics | None = None,
    ) -> StorageNode:
        """Open (or create) the storage directory; StorageDirectoryInUse / mismatch errors propagate."""
        manager = StorageManager(
            directory,
            cluster_key,
            num_partitions,
            segment_size_threshold=segment_size_threshold,
            max_record_size=limits.max_record_bytes,
            max_batch_bytes=limits.max_batch_bytes,
        )
        return cls(manager, limits, metrics)

    @property
    def limits(self) -> Limits:
        return self.executor.limits

    def check_cluster(self, cluster_key: uuid.UUID, num_partitions: int) -> None:
        """An Open: raise ClusterKeyMismatch / PartitionCountMismatch naming both sides unless both match."""
        mine, count = self.manager.cluster_key, self.manager.num_partitions
        if cluster_key != mine:
            raise ClusterKeyMismatch(
                f"cluster key mismatch: the request carries cluster key {cluster_key}, but this storage node "
                f"belongs to cluster key {mine}"
            )
        if num_partitions != count:
            raise PartitionCountMismatch(
                f"partition count mismatch: the request says {num_partitions} partitions, but this storage node "
                f"(cluster key {mine}) has {count}"
            )

    async def run(self, partition_id: int, fn: Callable[..., T], *args: Any) -> T:
        """Run fn(*args) on the partition's thread (partition_id must be in range)."""
        thread = self._threads.get(partition_id)
        if thread is None:
            thread = PartitionThread(f"partition-{partition_id}")
            self._threads[partition_id] = thread
        return await thread.submit(fn, args)

    def register(self, stream: Stoppable) -> None:
        self._streams.add(stream)

    def unregister(self, stream: Stoppable) -> None:
        self._streams.discard(stream)

    def begin_shutdown(self) -> None:
        """Stop reading every stream; queued requests still run and are answered."""
        self.stopping = True
        for stream in list(self._streams):
            stream.stop()

    def close(self) -> None:
        """Wait for running partition work (fsyncs included), then close the files."""
        self.stopping = True
        for thread in self._threads.values():
            thread.shutdown()
        self._threads.clear()
        self.manager.close()


class StreamReader:
    """Reads a server-side stream until EOF or stop(); stop interrupts only a read that is waiting.

    Must be used from the handler's task.
    """

    def __init__(self, context: grpc.aio.ServicerContext, node: StorageNode) -> None:
        self._context = context
        self._node = node
        self._task: asyncio.Task[Any] | None = None
        self._waiting = False
        self._stopped = node.stopping

    async def read(self) -> Any | None:
        """The next request, or None at the end of the stream or once stopped."""
        if self._stopped:
            return None
        self._task = asyncio.current_task()
        self._waiting = True
        try:
            message = await self._context.read()
        except asyncio.CancelledError:
            if self._stopped and self._task is not None and self._task.uncancel() == 0:
                return None
            raise
        finally:
            self._waiting = False
        return None if message is grpc.aio.EOF else message

    def stop(self) -> None:
        self._stopped = True
        if self._waiting and self._task is not None:
            self._task.cancel()

    def __enter__(self) -> StreamReader:
        self._node.register(self)
        return self

    def __exit__(self, *exc: object) -> None:
        self._node.unregister(self)
