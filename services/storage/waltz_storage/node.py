"""A storage node at run time: the engine, one worker thread per partition, and orderly shutdown."""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, NamedTuple, Protocol, TypeVar

import grpc

from waltz.v1 import storage_pb2
from waltz_common.health import Verdict
from waltz_storage.dispatch import Answers, Limits, RequestExecutor, StreamRequest
from waltz_storage.errors import ClusterKeyMismatch, PartitionCountMismatch, StorageError
from waltz_storage.health import ZkView, storage_verdicts
from waltz_storage.metrics import PartitionState, StorageMetrics
from waltz_storage.placement import AppendPlacement
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


class _Call(NamedTuple):
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[Any]
    fn: Callable[..., Any]
    args: tuple[Any, ...]


_END = None  # the end marker in a partition thread's queue
_NOTHING = object()


class WorkCount:
    """Work queued or running on a node's partition threads, all partitions together; any thread may count."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.value = 0

    def add(self, n: int) -> None:
        with self._lock:
            self.value += n


class PartitionThread:
    """A thread that runs a partition's work in the order it was queued: calls, whose futures it settles on
    their loop, and stream requests, which it hands in runs to serve, handing each group's answers to its
    stream.

    Cheaper per call than run_in_executor on a ThreadPoolExecutor (no concurrent Future, no chaining of two
    futures): a SimpleQueue in, one call_soon_threadsafe out. A call runs even if its awaiter is cancelled.
    A stream request costs less still: no future at all, and the requests queued together are served
    together (one run), so that serve can give consecutive appends one write and one fdatasync. work counts
    what is queued or running here until it is done (no longer touching the partition).
    """

    def __init__(
        self,
        name: str,
        serve: Callable[[list[StreamRequest]], Iterable[Answers]] | None = None,
        work: WorkCount | None = None,
    ) -> None:
        self._calls: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._serve = serve
        self._work_count = work or WorkCount()
        self._closed = False
        self._lock = threading.Lock()  # nothing is queued behind the end marker
        self._thread = threading.Thread(target=self._work, name=name, daemon=True)
        self._thread.start()

    def submit(self, fn: Callable[..., T], args: tuple[Any, ...]) -> asyncio.Future[T]:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        self._put(_Call(loop, future, fn, args))
        return future

    def post(self, request: StreamRequest) -> None:
        """Queue a stream request for serve; its stream gets the answer."""
        if self._serve is None:
            raise RuntimeError("this partition thread serves no stream requests")
        self._put(request)

    def _put(self, item: Any) -> None:
        with self._lock:
            if self._closed:
                raise RuntimeError("the partition thread is shut down")
            self._work_count.add(1)
            self._calls.put(item)

    def shutdown(self) -> None:
        """Run what was queued, then stop the thread."""
        with self._lock:
            self._closed = True
            self._calls.put(_END)
        self._thread.join()

    def _work(self) -> None:
        calls = self._calls
        carry: Any = _NOTHING
        while True:
            item = calls.get() if carry is _NOTHING else carry
            carry = _NOTHING
            if item is _END:
                return
            if type(item) is _Call:
                self._run(item)
                self._work_count.add(-1)
                continue
            run = [item]
            while not calls.empty():  # everything queued meanwhile joins the run, up to the next call
                item = calls.get()
                if type(item) is not StreamRequest:
                    carry = item
                    break
                run.append(item)
            self._serve_run(run)
            del run, item

    def _serve_run(self, run: list[StreamRequest]) -> None:
        """Serve a run group by group, each group counted done (no longer touching the partition) before it is
        answered: a request that its answer lets the server send finds the node quiet."""
        pending = len(run)
        try:
            for answers in self._serve(run):  # type: ignore[misc]
                done = len(answers.responses)
                self._work_count.add(-done)
                pending -= done
                answers.stream.answer(answers.partition_id, answers.responses)
        except BaseException:  # serve answers every request, failures too; should it raise, the thread lives on
            log.exception("serving %d stream requests failed", len(run))
        finally:
            self._work_count.add(-pending)

    @staticmethod
    def _run(call: _Call) -> None:
        result, error = None, None
        try:
            result = call.fn(*call.args)
        except BaseException as e:  # handed to the awaiter, as run_in_executor would
            error = e
        try:
            call.loop.call_soon_threadsafe(_settle, call.future, result, error)
        except RuntimeError:  # the loop is closed: nobody is waiting any more
            pass


class StorageNode:
    """Owns the StorageManager; every operation on a partition runs on that partition's single thread, but
    an append while the node is otherwise quiet, which runs on the event loop (placement.AppendPlacement).

    One thread per partition keeps each partition's requests in order, from every stream and the
    admin port alike, while blocking file I/O and fsync stay off the event loop and partitions never
    wait for each other. An append runs on the loop only while no thread has any work, so it is still
    the only thing touching its partition, after everything that came before it.
    """

    def __init__(self, manager: StorageManager, limits: Limits, metrics: StorageMetrics | None = None) -> None:
        self.manager = manager
        self.metrics = metrics or StorageMetrics()
        self.executor = RequestExecutor(manager, limits, self.metrics)
        self.stopping = False
        self.zk_view: ZkView | None = None
        """What ZooKeeper last said of this node's replicas (waltz_storage.zk_view); None: not read (readiness then
        asks only the partitions held here)."""
        self._threads: dict[int, PartitionThread] = {}
        self._work = WorkCount()
        self._placement = AppendPlacement()
        self._streams: set[Stoppable] = set()
        self.metrics.watch_partitions(self._partition_states)
        self.metrics.watch_damage(self._damage)

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

    def _partition_states(self) -> list[PartitionState]:
        """The partitions' gauges, read when scraped: from the metrics server's thread, plain reads only."""
        states = []
        for partition_id, partition in self.manager.open_partitions():
            try:
                low_water_mark = partition.last_session_info().low_water_mark
            except StorageError:  # its control file structs are both damaged: no gauges for it
                continue
            states.append(
                (partition_id, partition.max_transaction_id, low_water_mark, partition.fence.highest_session_id)
            )
        return states

    def _damage(self) -> tuple[int, int]:
        """(records found damaged since start, damaged now) over the open partitions; plain reads only."""
        partitions = [p for _, p in self.manager.open_partitions()]
        return sum(p.damage_found for p in partitions), sum(p.damaged_count for p in partitions)

    def health(self) -> dict[str, Verdict]:
        """The verdicts of the node's health names, now (from the loop)."""
        return storage_verdicts(
            self.manager.assigned_partitions(),
            self.manager.open_failures(),
            self.executor.write_failures.snapshot(),
            self.zk_view,
        )

    def check_cluster(self, cluster_key: uuid.UUID, num_partitions: int) -> None:
        """An Open: raise ClusterKeyMismatch / PartitionCountMismatch unless both match."""
        mine, count = self.manager.cluster_key, self.manager.num_partitions
        # Neither key is ever put in a message or a log line: without TLS the cluster key is the storage port's
        # only credential (docs/security.md), and the one sent may be a mistyped copy of the real one.
        if cluster_key != mine:
            raise ClusterKeyMismatch(
                "cluster key mismatch: the request carries another cluster key than the one this storage node "
                "belongs to (compare with `waltz cluster show-key`)"
            )
        if num_partitions != count:
            raise PartitionCountMismatch(
                f"partition count mismatch: the request says {num_partitions} partitions, but this storage node's "
                f"cluster has {count}"
            )

    async def run(self, partition_id: int, fn: Callable[..., T], *args: Any) -> T:
        """Run fn(*args) on the partition's thread (partition_id must be in range)."""
        return await self._thread(partition_id).submit(fn, args)

    def serve(self, request: StreamRequest, stream_quiet: bool) -> list[storage_pb2.StorageResponse] | None:
        """Serve a stream request (its partition_id must be in range): its answers now, when it ran right here
        on the loop, or None when it is queued on its partition's thread, which answers it to its stream.

        stream_quiet: the stream has answered everything before this request (the loop has the answers).
        """
        partition_id = request.msg.partition_id
        if request.kind != "append":
            self._placement.elsewhere(partition_id)
        elif self._placement.on_loop(partition_id, stream_quiet and not self._work.value):
            started = time.perf_counter()
            responses = self.executor.execute_appends((request.msg,), request.caller)
            self._placement.took(time.perf_counter() - started)
            return responses
        self._thread(partition_id).post(request)
        return None

    def serve_arrived(self, run: list[StreamRequest], stream_idle: bool) -> list[Answers] | None:
        """Serve appends of one partition (in range) that arrived together on a stream that hands its requests
        over as they arrive: their answers now, when they ran right here on the loop (those that can share a
        write and fdatasync do: RequestExecutor.serve), or None when they are queued on the partition's thread,
        which answers them to their stream (placement.AppendPlacement.inline).

        stream_idle: the stream has the answers of all its requests before these (none is on a thread)."""
        partition_id = run[0].msg.partition_id
        if self._placement.inline(partition_id, stream_idle and not self._work.value):
            started = time.perf_counter()
            answers = list(self.executor.serve(run))
            self._placement.took(time.perf_counter() - started)
            return answers
        thread = self._thread(partition_id)
        for request in run:
            thread.post(request)
        return None

    def _thread(self, partition_id: int) -> PartitionThread:
        thread = self._threads.get(partition_id)
        if thread is None:
            thread = PartitionThread(f"partition-{partition_id}", self.executor.serve, self._work)
            self._threads[partition_id] = thread
        return thread

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


class MessageSource(Protocol):
    """What StreamReader reads: a grpc.aio.ServicerContext, or a framed Session connection (session_port)."""

    async def read(self) -> Any:
        """The next message, or grpc.aio.EOF at the end of the stream."""
        ...


class StreamReader:
    """Reads a server-side stream until EOF or stop(); stop interrupts only a read that is waiting.

    Must be used from the handler's task.
    """

    def __init__(self, context: MessageSource, node: StorageNode) -> None:
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
