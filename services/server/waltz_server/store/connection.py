"""One multiplexed WaltzStorage.Session stream per storage node, shared by every replica on it (their pool:
store/connections.py)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

import grpc
import grpc.aio

from waltz.v1 import storage_pb2
from waltz_common import tls
from waltz_common.grpc_env import keepalive_options
from waltz_common.wire import varint
from waltz_server.store.events import first_to_end
from waltz_server.store.framed_session import FramedCall, open_framed
from waltz_server.store.settings import Backoff, StoreSettings
from waltz_server.store.wire import open_request, request_body, response_body

log = logging.getLogger(__name__)

Code = storage_pb2.StorageRpcException.ErrorCode
_SESSION_METHOD = f"/{storage_pb2.DESCRIPTOR.services_by_name['WaltzStorage'].full_name}/Session"
# Storage bounds its answers by its own batch limit (storage.maxBatchBytes, 64 MiB by default), far above
# gRPC's 4 MiB default: the server takes whatever size the storage node sends.
CHANNEL_OPTIONS: tuple[tuple[str, int | str], ...] = (
    ("grpc.max_receive_message_length", -1),
    ("grpc.max_send_message_length", -1),
)


class StorageError(Exception):
    """A storage request did not get a successful answer."""


class StorageRpcError(StorageError):
    """The storage node answered Failure (its StorageRpcException's code and message)."""

    def __init__(self, code: int, message: str) -> None:
        name = Code.Name(code) if code in Code.values() else str(code)  # type: ignore[arg-type]
        super().__init__(f"{name}: {message}")
        self.code = code
        self.message = message


class StorageConnectionLost(StorageError):
    """The stream the request was sent on is gone (or was never up); the request's outcome is unknown."""


class StorageTimeout(StorageError):
    """No answer within storage.requestTimeoutSeconds; the request's outcome is unknown."""


_REQUEST_TAGS = {
    field.name: varint(field.number << 3 | 2)  # the oneof member as a length-delimited field
    for field in storage_pb2.StorageRequest.DESCRIPTOR.oneofs_by_name["request"].fields
}
_SEQ_NUM_TAG = varint(2 << 3)  # seq_num, a varint field
assert all(
    field.message_type is not None and field.message_type.fields_by_name["seq_num"].number == 2
    for field in storage_pb2.StorageRequest.DESCRIPTOR.oneofs_by_name["request"].fields
), "every storage request carries seq_num as field 2"


def seq_num_patch(message: storage_pb2.StorageRequest, seq: int) -> bytes:
    """The bytes that, appended to message serialized without a seq_num, set its seq_num to seq: the request's
    oneof member once more, holding only the seq_num, which a protobuf parser merges into the first. Encoded
    here (a message built and serialized for it cost about 15 us, three times per batch)."""
    kind = message.WhichOneof("request")
    if kind is None:
        raise ValueError("empty storage request")
    body = _SEQ_NUM_TAG + varint(seq)
    return _REQUEST_TAGS[kind] + varint(len(body)) + body


def _describe(exc: BaseException) -> str:
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    if isinstance(exc, grpc.aio.AioRpcError):
        return f"{exc.code().name}: {exc.details()}"
    return f"{type(exc).__name__}: {exc}"


class Answer:
    """The slot of one request's answer that calls back as the answer comes (from the transport's callback, or the
    gRPC stream's read loop), where a Future schedules its callbacks for the loop's next turn: a store batch's
    answers are counted without a hop. The Future's methods that its users call, with the same meaning; cancel()
    calls nothing back (the canceller knows)."""

    __slots__ = ("_callback", "_cancelled", "_error", "_response")

    def __init__(self, callback: Callable[[Answer], None]) -> None:
        self._callback = callback
        self._response: storage_pb2.StorageResponse | None = None
        self._error: BaseException | None = None
        self._cancelled = False

    def done(self) -> bool:
        return self._response is not None or self._error is not None or self._cancelled

    def cancelled(self) -> bool:
        return self._cancelled

    def set_result(self, response: storage_pb2.StorageResponse) -> None:
        if not self.done():
            self._response = response
            self._callback(self)

    def set_exception(self, error: BaseException) -> None:
        if not self.done():
            self._error = error
            self._callback(self)

    def cancel(self) -> None:
        if not self.done():
            self._cancelled = True

    def result(self) -> storage_pb2.StorageResponse:
        if self._cancelled:
            raise asyncio.CancelledError()
        if self._error is not None:
            raise self._error
        if self._response is None:
            raise asyncio.InvalidStateError("no answer yet")
        return self._response

    def exception(self) -> BaseException | None:
        return self._error


@dataclass(eq=False)
class _Stream:
    """One open Session stream: outgoing messages, requests awaiting answers by sequence number."""

    epoch: int
    outgoing: asyncio.Queue[bytes] = field(default_factory=asyncio.Queue)
    pending: dict[int, asyncio.Future[storage_pb2.StorageResponse] | Answer] = field(default_factory=dict)
    lost: asyncio.Event = field(default_factory=asyncio.Event)
    next_seq: int = 0
    direct: FramedCall | None = None
    """The framed connection, written by send() itself while nothing waits in outgoing (None: a gRPC stream,
    which only the writer task writes)."""

    def put(self, data: bytes) -> None:
        """Send data after everything sent before it: written now when the framed connection takes it without
        waiting and nothing is queued ahead of it, else queued for the writer task. The writer task writes a
        frame in the same step as it takes it from the queue, so an empty queue means every earlier frame is in
        the transport already."""
        direct = self.direct
        if direct is None or self.outgoing.qsize() or not direct.write_now(data):
            # Unbounded: what is in flight on a connection is bounded by its callers (each request is awaited,
            # and a store session holds at most storage.maxReplicaBacklogBytes of appends per replica).
            self.outgoing.put_nowait(data)

    def answered(self, response: storage_pb2.StorageResponse) -> None:
        """An answer came: to the request waiting for its seq_num (none: given up, or a keepalive ping's)."""
        waiting = self.pending.pop(response_body(response).seq_num, None)
        if waiting is not None and not waiting.done():
            waiting.set_result(response)

    def fail(self, reason: str) -> None:
        self.lost.set()
        pending, self.pending = self.pending, {}
        for future in pending.values():
            if not future.done():
                future.set_exception(StorageConnectionLost(reason))


class StorageConnection:
    """The Session stream to one storage node ("host:port"), reopened with exponential backoff when lost.

    Each successful Open starts a new epoch. A replica session binds to the epoch it was opened on:
    requests carrying that epoch fail with StorageConnectionLost once the stream is gone, even after a
    reconnect, and ``wait_lost(epoch)`` returns when that stream ends (that is how its session learns).
    """

    def __init__(
        self,
        connect_string: str,
        cluster_key: str,
        num_partitions: int,
        settings: StoreSettings,
        *,
        channel_options: tuple[tuple[str, int | str], ...] = CHANNEL_OPTIONS,
    ) -> None:
        self.connect_string = connect_string
        self._cluster_key = cluster_key
        self._num_partitions = num_partitions
        self._settings = settings
        self._channel_options = channel_options
        self._stream: _Stream | None = None
        self._epoch = 0
        self._up = asyncio.Event()
        self._closed = False
        self._last_error = "not connected yet"
        self._task: asyncio.Task[None] | None = None
        self.transport = ""
        """What the current stream runs on: "framed" (the node's session port), "grpc", or "" (none yet)."""

    @property
    def connected(self) -> bool:
        return self._stream is not None and not self._stream.lost.is_set()

    @property
    def last_error(self) -> str:
        """Why the connection is down (empty while connected)."""
        return "" if self.connected else self._last_error

    def start(self) -> None:
        """Start connecting (idempotent); the connection task is owned here and ended by close()."""
        if self._task is None and not self._closed:
            self._task = asyncio.get_running_loop().create_task(self._run(), name=f"storage {self.connect_string}")

    async def close(self) -> None:
        self._closed = True
        self._up.set()  # wake wait_connected() callers so they see the close
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass
        if self._stream is not None:
            self._stream.fail(f"connection to {self.connect_string} closed")
            self._stream = None

    async def wait_connected(self) -> int:
        """Wait until the stream is open; returns its epoch. StorageConnectionLost once closed."""
        while True:
            if self._closed:
                raise StorageConnectionLost(f"connection to {self.connect_string} closed")
            stream = self._stream
            if stream is not None and not stream.lost.is_set():
                return stream.epoch
            self._up.clear()
            await self._up.wait()

    def epoch_alive(self, epoch: int) -> bool:
        stream = self._stream
        return stream is not None and stream.epoch == epoch and not stream.lost.is_set()

    async def wait_lost(self, epoch: int) -> None:
        """Return once the stream of that epoch has ended (at once if it already has)."""
        stream = self._stream
        if stream is None or stream.epoch != epoch:
            return
        await stream.lost.wait()

    async def request(
        self,
        message: storage_pb2.StorageRequest,
        *,
        epoch: int | None = None,
        timeout: float | None = None,
        serialized: bytes | None = None,
    ) -> storage_pb2.StorageResponse:
        """Send message (its seq_num is set here) and return the matching answer.

        serialized: see send(). StorageRpcError for a Failure answer; StorageConnectionLost when the stream
        (of epoch, if given) is gone; StorageTimeout after timeout (default storage.requestTimeoutSeconds).
        """
        return await self.answer(self.send(message, epoch=epoch, serialized=serialized), timeout)

    def send(
        self, message: storage_pb2.StorageRequest, *, epoch: int | None = None, serialized: bytes | None = None
    ) -> asyncio.Future[storage_pb2.StorageResponse]:
        """Send message to the node now (its seq_num is set here); the future gets its raw answer, or
        StorageConnectionLost when the stream ends first. answer() checks and times the answer.

        serialized: the message already serialized with seq_num 0 (one append goes to every replica: it is
        serialized once, and each copy gets its seq_num by a second occurrence of the request's field,
        which a protobuf parser merges into the first).

        StorageConnectionLost at once when the stream (of epoch, if given) is gone.
        """
        future: asyncio.Future[storage_pb2.StorageResponse] = asyncio.get_running_loop().create_future()
        self._send(message, epoch, serialized, future)
        return future

    def send_answered(self, message: storage_pb2.StorageRequest, answer: Answer, *, epoch: int | None = None,
                      serialized: bytes | None = None) -> None:
        """send(), its raw answer (or StorageConnectionLost when the stream ends first) set on answer, which calls
        back at once. StorageConnectionLost at once when the stream (of epoch, if given) is gone."""
        self._send(message, epoch, serialized, answer)

    def _send(self, message: storage_pb2.StorageRequest, epoch: int | None, serialized: bytes | None,
              slot: asyncio.Future[storage_pb2.StorageResponse] | Answer) -> None:
        stream = self._stream
        if stream is None or stream.lost.is_set() or (epoch is not None and stream.epoch != epoch):
            raise StorageConnectionLost(f"{self.connect_string}: not connected ({self._last_error})")
        seq = stream.next_seq
        stream.next_seq += 1
        if serialized is None:
            request_body(message).seq_num = seq
            data = message.SerializeToString()  # now, so one message object can go to several nodes
        else:
            data = serialized + seq_num_patch(message, seq)
        stream.pending[seq] = slot
        stream.put(data)

    async def answer(
        self, sent: asyncio.Future[storage_pb2.StorageResponse], timeout: float | None = None
    ) -> storage_pb2.StorageResponse:
        """The answer to a request send() queued. StorageRpcError for a Failure answer, StorageConnectionLost
        when the stream ended first, StorageTimeout after timeout (default storage.requestTimeoutSeconds; the
        request's entry is then dropped when its late answer comes or the stream ends)."""
        limit = self._settings.request_timeout_s if timeout is None else timeout
        try:
            async with asyncio.timeout(limit):
                response = await sent
        except TimeoutError:
            sent.cancel()
            raise StorageTimeout(f"{self.connect_string}: no answer within {limit:g} s") from None
        return self.checked(response)

    @property
    def request_timeout_s(self) -> float:
        return self._settings.request_timeout_s

    def checked(self, response: storage_pb2.StorageResponse) -> storage_pb2.StorageResponse:
        """The response, or StorageRpcError when it is a Failure."""
        if response.HasField("failure"):
            exception = response.failure.exception
            raise StorageRpcError(exception.code, f"{self.connect_string}: {exception.message}")
        return response

    async def _run(self) -> None:
        backoff = Backoff.of(self._settings)
        while not self._closed:
            epoch = self._epoch
            try:
                await self._serve_stream()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self._last_error = _describe(exc)
                log.info("storage %s: %s", self.connect_string, self._last_error)
            if self._epoch != epoch:
                backoff.reset()
            await asyncio.sleep(backoff.next_delay())

    async def _serve_stream(self) -> None:
        # Ping after storage.keepaliveTime without data, give up after as long again without an answer, and go
        # on pinging an idle stream (gRPC stops after two pings without data by default).
        ms = max(1, round(self._settings.keepalive_time_s * 1000))
        options = (
            *self._channel_options,
            *keepalive_options(ms, ms),
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.max_pings_without_data", 0),
        )
        channel: grpc.aio.Channel | None = tls.aio_channel(self.connect_string, tls.process_files(), options)
        assert channel is not None
        call: grpc.aio.StreamStreamCall | FramedCall = channel.stream_stream(
            _SESSION_METHOD,
            request_serializer=lambda data: data,
            response_deserializer=storage_pb2.StorageResponse.FromString,
        )()
        stream: _Stream | None = None
        try:
            answer = await self._open(call)
            framed = await self._framed(answer.success.session_port)
            if framed is not None:  # the gRPC stream only told where the framed port is: end it
                call.cancel()
                await channel.close(grace=None)
                channel, call = None, framed
            self._epoch += 1
            stream = self._stream = _Stream(self._epoch, direct=framed)
            self.transport = "grpc" if framed is None else "framed"
            self._up.set()
            log.info(
                "storage %s: connected (epoch %d, %s)",
                self.connect_string,
                stream.epoch,
                "gRPC stream" if framed is None else f"framed session port {answer.success.session_port}",
            )
            # Not a TaskGroup: _run retries after an error, and must not lose close()'s cancellation meanwhile.
            loops = [self._write_loop(call, stream)]
            if framed is not None:
                loops += [self._framed_answers(framed, stream), self._keepalive(framed, stream)]
            else:
                assert not isinstance(call, FramedCall)
                loops.append(self._read_loop(call, stream))
            await first_to_end(*loops)
        except BaseException as exc:
            if stream is not None:
                stream.fail(f"{self.connect_string}: stream lost ({_describe(exc)})")
            raise
        finally:
            if stream is not None and self._stream is stream:
                self._stream = None
            if isinstance(call, FramedCall):
                await call.close()
            else:
                call.cancel()
            if channel is not None:
                await channel.close(grace=None)

    async def _open(self, call: grpc.aio.StreamStreamCall | FramedCall) -> storage_pb2.StorageResponse:
        """Send Open on a new stream; its successful answer, else StorageConnectionLost or StorageRpcError."""
        async with asyncio.timeout(self._settings.request_timeout_s):
            await call.write(open_request(self._cluster_key, self._num_partitions).SerializeToString())
            answer = await call.read()
        if answer is grpc.aio.EOF:
            raise StorageConnectionLost("the stream ended before Open was answered")
        assert isinstance(answer, storage_pb2.StorageResponse)
        if answer.HasField("failure"):
            exception = answer.failure.exception
            log.error("storage %s refused Open: %s", self.connect_string, exception.message)
            raise StorageRpcError(exception.code, exception.message)
        return answer

    async def _framed(self, port: int) -> FramedCall | None:
        """The framed Session connection to port on the node's host, opened; None when the node advertises none,
        storage.useSessionPort is off, or it fails (logged: the gRPC stream serves instead)."""
        if not port or not self._settings.use_session_port:
            return None
        host = self.connect_string.rpartition(":")[0]
        call: FramedCall | None = None
        try:
            async with asyncio.timeout(self._settings.request_timeout_s):
                call = await open_framed(host, port, tls.process_files(), self._settings.keepalive_time_s)
            await self._open(call)
            return call
        except Exception as exc:
            log.warning(
                "storage %s: its framed session port %s:%d failed (%s); using the gRPC stream",
                self.connect_string, host, port, _describe(exc),
            )
            if call is not None:
                await call.close()
            return None

    async def _keepalive(self, call: FramedCall, stream: _Stream) -> None:
        """Ping (an Open) after storage.keepaliveTime without an answer; StorageConnectionLost when a ping is not
        answered within as long again."""
        idle = self._settings.keepalive_time_s
        ping = open_request(self._cluster_key, self._num_partitions)
        while True:
            await asyncio.sleep(max(0.0, idle - call.silent_for()))
            if call.silent_for() < idle:
                continue
            ping.open.seq_num = stream.next_seq  # a seq_num nobody waits for: its answer is dropped
            stream.next_seq += 1
            stream.put(ping.SerializeToString())
            await asyncio.sleep(idle)
            if call.silent_for() >= 2 * idle:
                raise StorageConnectionLost(f"no answer to a keepalive ping within {idle:g} s")

    @staticmethod
    async def _write_loop(call: grpc.aio.StreamStreamCall | FramedCall, stream: _Stream) -> None:
        while True:
            await call.write(await stream.outgoing.get())

    async def _read_loop(self, call: grpc.aio.StreamStreamCall, stream: _Stream) -> None:
        while True:
            response = await call.read()
            if response is grpc.aio.EOF:
                raise StorageConnectionLost("the storage node ended the stream")
            assert isinstance(response, storage_pb2.StorageResponse)
            stream.answered(response)

    @staticmethod
    async def _framed_answers(call: FramedCall, stream: _Stream) -> None:
        """The framed connection hands each answer on as it arrives (no task step per answer); wait for its end."""
        call.deliver(stream.answered)
        error = await call.ended()
        raise error if error is not None else StorageConnectionLost("the storage node ended the stream")
