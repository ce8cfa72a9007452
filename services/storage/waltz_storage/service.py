"""The WaltzStorage.Session stream: Open, then requests multiplexed over partitions, each served on its
partition's thread (or, an append while the node is quiet, on the loop) and answered in completion order.

A gRPC stream is read by a task; a framed one (session_port) hands its requests over as they arrive
(Arrivals), and they are served right there, in the transport's callback: the append path of a round is
straight-line code, from the bytes received to the answer written, with no task woken for it."""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

import grpc

from waltz.v1 import storage_pb2, storage_pb2_grpc
from waltz_common import tls
from waltz_storage import protocol, rules
from waltz_storage.dispatch import StreamRequest
from waltz_storage.errors import InvalidRequest, StorageError
from waltz_storage.node import MessageSource, StorageNode, StreamReader

PARTITION_QUEUE_SIZE = 100  # requests of one partition waiting for their answer; then the stream is not read
RESPONSE_QUEUE_SIZE = 1000  # answers waiting to be written to one stream; then the stream is not read

log = logging.getLogger(__name__)


class SessionContext(MessageSource, Protocol):
    """The two ends of a Session stream StorageConnection uses: a grpc.aio.ServicerContext, or a framed
    connection (framed_connection.FramedConnection)."""

    async def write(self, message: storage_pb2.StorageResponse) -> None: ...


WriteNow = Callable[[storage_pb2.StorageResponse], bool]
"""Writes an answer at once if the stream takes it without waiting; False when it must go through write."""


class Arrivals(Protocol):
    """A stream that hands its requests over as they arrive (framed_connection.FramedConnection)."""

    def attach(self, on_arrival: Callable[[], None] | None) -> None:
        """Call on_arrival() whenever requests (or the end) have arrived, now too if some have."""

    def next_request(self) -> storage_pb2.StorageRequest | object | None:
        """The next request that has arrived, None when none has yet, grpc.aio.EOF at the end."""


class StorageConnection:
    """One server connection: reads requests and has the node serve each (StorageNode.serve): on its
    partition's thread, which answers it (answer, from that thread), or right away. An answer goes out at once
    when the stream takes it (write_now) and nothing waits before it; else one writer task writes the answers
    in the order they come.

    With arrivals (a framed stream), the requests are taken as they arrive (_take): each run of appends of one
    partition that came together is served as one (StorageNode.serve_arrived).

    Back-pressure: reading stops while one partition has PARTITION_QUEUE_SIZE requests unanswered, or
    RESPONSE_QUEUE_SIZE answers wait to be written.
    """

    def __init__(
        self,
        node: StorageNode,
        context: SessionContext,
        caller: rules.Caller = rules.PLAINTEXT,
        session_port: int = 0,
        backlog: Callable[[], bool] | None = None,
        write_now: WriteNow | None = None,
        arrivals: Arrivals | None = None,
    ) -> None:
        self.node = node
        self.context = context
        self.caller = caller
        self.session_port = session_port  # advertised in the answer to an Open (0: none)
        # Whether more of the peer's requests have arrived already (unknown on a gRPC stream: False).
        self._backlog = backlog if backlog is not None else _unknown
        # An answer made on the loop goes straight out through it while nothing waits before it (framed streams).
        self._write_now = write_now
        self.opened = False
        self._loop = asyncio.get_running_loop()
        self._outbox: deque[storage_pb2.StorageResponse] = deque()
        self._unanswered: dict[int, int] = {}  # partition id -> requests queued on its thread, not yet answered
        self._in_flight = 0  # their sum
        self._reading = True
        self._writer_idle: asyncio.Future[None] | None = None  # the writer waits on it for answers
        self._reader_held: asyncio.Future[None] | None = None  # the reader waits on it for room
        self._arrivals = arrivals
        self._last_partition: int | None = None  # of the last request taken from arrivals
        self._taking = False  # _take is running (an answer it writes must not take more meanwhile)
        self._held_back = False  # _take stopped for back-pressure: requests wait until there is room
        self._taken_all: asyncio.Future[None] | None = None  # set at the end of the arrivals, or on stop()

    async def run(self) -> None:
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(self._write_loop())
            try:
                if self._arrivals is not None:
                    await self._take_arrivals(self._arrivals)
                    return
                with StreamReader(self.context, self.node) as reader:
                    while (request := await reader.read()) is not None:
                        partition_id, answered = self._dispatch(request)
                        if answered:
                            # Let the writer send the answer before this task asks gRPC for the next request:
                            # a server that keeps one append in flight sends none before it has this answer.
                            await asyncio.sleep(0)
                        while len(self._outbox) >= RESPONSE_QUEUE_SIZE or (
                            partition_id is not None and self._unanswered.get(partition_id, 0) >= PARTITION_QUEUE_SIZE
                        ):
                            self._reader_held = self._loop.create_future()
                            await self._reader_held
            finally:
                self._end_of_requests()

    # ------------------------------------------------------------------ taking the requests as they arrive

    async def _take_arrivals(self, arrivals: Arrivals) -> None:
        """Serve arrivals' requests as they come, until their end or stop()."""
        self._taken_all = self._loop.create_future()
        self.node.register(self)
        try:
            if not self.node.stopping:
                arrivals.attach(self._take)
                await self._taken_all
        finally:
            arrivals.attach(None)
            self.node.unregister(self)

    def stop(self) -> None:
        """The node stops: take no more requests (those taken are still answered)."""
        if self._taken_all is not None and not self._taken_all.done():
            self._taken_all.set_result(None)

    def _held(self) -> bool:
        """Back-pressure: too many answers wait to be written, or requests of the last partition to be answered."""
        return len(self._outbox) >= RESPONSE_QUEUE_SIZE or (
            self._last_partition is not None
            and self._unanswered.get(self._last_partition, 0) >= PARTITION_QUEUE_SIZE
        )

    def _take(self) -> None:
        """Serve the requests that have arrived, in order, as far as back-pressure lets: consecutive appends of
        one partition as one run (StorageNode.serve_arrived), anything else one by one (_dispatch)."""
        taken_all, arrivals = self._taken_all, self._arrivals
        if self._taking or taken_all is None or taken_all.done() or arrivals is None:
            return
        self._taking = True
        run: list[StreamRequest] = []
        try:
            while True:
                if run and self._unanswered.get(run[0].msg.partition_id, 0) + len(run) >= PARTITION_QUEUE_SIZE:
                    self._serve_run(run)  # counted now: _held sees whether its partition's queue is full
                    run = []
                if self._held():
                    self._held_back = True
                    break
                request = arrivals.next_request()
                if request is None or request is grpc.aio.EOF:
                    if request is grpc.aio.EOF:
                        taken_all.set_result(None)
                    break
                assert isinstance(request, storage_pb2.StorageRequest)
                msg = request.append if request.WhichOneof("request") == "append" else None
                if run and (msg is None or msg.partition_id != run[0].msg.partition_id):
                    self._serve_run(run)
                    run = []
                if msg is None or not self.opened:
                    self._last_partition = self._dispatch(request)[0]
                elif self._valid_partition(msg):
                    run.append(StreamRequest("append", msg, self, self.caller))
                    self._last_partition = msg.partition_id
            if run:
                self._serve_run(run)
        finally:
            self._taking = False

    def _valid_partition(self, msg: storage_pb2.StorageAppendRequest) -> bool:
        """Whether msg's partition id is in range; if not, it is answered with a Failure here."""
        try:
            self.node.manager.control_file.check_partition_id(msg.partition_id)
        except StorageError as e:
            self._fail(msg, e)
            return False
        return True

    def _serve_run(self, run: list[StreamRequest]) -> None:
        partition_id = run[0].msg.partition_id
        # Answers of this stream's requests on a thread may be on their way to the loop still (answer): those come
        # first, so the run waits its turn on the thread.
        answers = self.node.serve_arrived(run, stream_idle=not self._in_flight)
        if answers is None:
            self._unanswered[partition_id] = self._unanswered.get(partition_id, 0) + len(run)
            self._in_flight += len(run)
            return
        for group in answers:
            self._send(group.responses)

    # ------------------------------------------------------------------ reading

    def _dispatch(self, request: storage_pb2.StorageRequest) -> tuple[int | None, bool]:
        """Have the node serve it (right away, or on its partition's thread); return its partition id (None for
        an Open, or a request refused before it reaches a partition) and whether it is answered already."""
        kind = request.WhichOneof("request")
        if kind is None:
            self._fail(None, InvalidRequest("the request carries no message (none of the oneof is set)"))
            return None, True
        msg = getattr(request, kind)
        if kind == "open":
            self._push(self._open(msg))
            return None, True
        if not self.opened:
            self._fail(msg, protocol.NotOpen("the stream is not open: send an Open request with the cluster key"))
            return None, True
        partition_id: int = msg.partition_id
        try:
            self.node.manager.control_file.check_partition_id(partition_id)
        except StorageError as e:
            self._fail(msg, e)
            return None, True
        unanswered = self._unanswered.get(partition_id, 0)
        # Everything before this request is answered, and no later one waits: a request that arrived while an append
        # ran on the loop shows the server pipelines (placement.AppendPlacement sends such appends to the thread).
        quiet = not unanswered and not self._outbox and not self._backlog()
        responses = self.node.serve(StreamRequest(kind, msg, self, self.caller), stream_quiet=quiet)
        if responses is not None:  # served right here
            write_now = self._write_now
            if write_now is not None and not self._outbox and len(responses) == 1 and write_now(responses[0]):
                # Nothing waited to be written before it: sent already, with no hop through the writer task,
                # and nothing for it to do before the next request is read.
                return partition_id, False
            self._outbox.extend(responses)
            self._wake_writer()
            return partition_id, True
        self._unanswered[partition_id] = unanswered + 1
        self._in_flight += 1
        return partition_id, False

    def _open(self, msg: storage_pb2.OpenRequest) -> storage_pb2.StorageResponse:
        """Check the cluster key; a failed Open leaves the stream unopened, and another Open may follow."""
        try:
            self.node.check_cluster(protocol.parse_cluster_key(msg.cluster_key), msg.num_partitions)
        except StorageError as e:
            self.opened = False
            log.warning("refused an Open: %s", e)  # the message never holds a cluster key (StorageNode.check_cluster)
            return self.node.executor.failure(msg, e)
        self.opened = True
        response = protocol.success(msg.session_id, msg.seq_num, msg.partition_id)
        if self.session_port:
            response.success.session_port = self.session_port
        return response

    def _fail(self, msg: Any, exc: StorageError) -> None:
        self._push(self.node.executor.failure(msg, exc))

    def _end_of_requests(self) -> None:
        """No more requests: the writer stops once every request read is answered and written."""
        self._reading = False
        self._wake_writer()

    # ------------------------------------------------------------------ answering

    def answer(self, partition_id: int, responses: list[storage_pb2.StorageResponse]) -> None:
        """Answers from a partition's thread: one wake-up of the loop for them all."""
        try:
            self._loop.call_soon_threadsafe(self._answered, partition_id, responses)
        except RuntimeError:  # the loop is closed: nobody is left to answer
            pass

    def _answered(self, partition_id: int, responses: list[storage_pb2.StorageResponse]) -> None:
        self._unanswered[partition_id] -= len(responses)
        self._in_flight -= len(responses)
        self._send(responses)
        self._wake_reader()
        if not self._reading and not self._in_flight:
            self._wake_writer()  # the last answer: the writer ends

    def _send(self, responses: list[storage_pb2.StorageResponse]) -> None:
        """Answers in order: at once while nothing waits before them and the stream takes them (write_now), the
        rest through the writer task."""
        write_now, outbox = self._write_now, self._outbox
        if write_now is not None and not outbox:
            for i, response in enumerate(responses):
                if not write_now(response):
                    outbox.extend(responses[i:])
                    break
        else:
            outbox.extend(responses)
        if outbox:
            self._wake_writer()

    def _push(self, response: storage_pb2.StorageResponse) -> None:
        self._send([response])

    def _wake_writer(self) -> None:
        if self._writer_idle is not None and not self._writer_idle.done():
            self._writer_idle.set_result(None)

    def _wake_reader(self) -> None:
        """Let a reader held by back-pressure look again."""
        if self._reader_held is not None and not self._reader_held.done():
            self._reader_held.set_result(None)
        elif self._held_back and not self._taking and not self._held():
            self._held_back = False
            self._take()

    async def _write_loop(self) -> None:
        """Write answers as they come until the stream is read to its end and every request is answered."""
        outbox = self._outbox
        writing = True
        while True:
            while outbox:
                response = outbox.popleft()
                self._wake_reader()
                if not writing:
                    continue  # keep taking answers, so that the reader never waits for a writer that is gone
                try:
                    await self.context.write(response)
                except Exception as exc:  # the server went away (a crash, kill -9): nobody is left to answer
                    writing = False
                    log.info("a server stream ended while it was being answered: %s: %s", type(exc).__name__, exc)
            if not self._reading and not self._in_flight:
                return
            self._writer_idle = self._loop.create_future()
            await self._writer_idle


def _unknown() -> bool:
    return False


def caller_of(context: grpc.aio.ServicerContext, mutual_tls: bool) -> rules.Caller:
    """Who the peer is: its certificate's roles under mutual TLS; without TLS, whoever sent the cluster key."""
    if not mutual_tls:
        return rules.PLAINTEXT
    pems = context.auth_context().get("x509_pem_cert") or []
    return rules.Caller.from_roles(tls.roles_of(pems[0]) if pems else ())


class StorageService(storage_pb2_grpc.WaltzStorageServicer):
    """grpc.aio servicer of WaltzStorage; mutual_tls: the port runs mutual TLS (callers have roles)."""

    def __init__(self, node: StorageNode, mutual_tls: bool = False) -> None:
        self.node = node
        self.mutual_tls = mutual_tls
        self.session_port = 0
        """The node's framed Session port, advertised in the answer to an Open (0: none); set once it is bound."""

    async def Session(self, request_iterator: Any, context: grpc.aio.ServicerContext) -> None:
        caller = caller_of(context, self.mutual_tls)
        await StorageConnection(self.node, context, caller, self.session_port).run()
