"""One stream per server: ordered sends that batch appends, receives routed to partitions."""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

from waltz.v1 import server_pb2
from waltz_client.driver import Driver, ServerStream
from waltz_client.errors import StreamClosedError
from waltz_client.tasks import TaskSet
from waltz_client.wire import message_partitions

MAX_RECONNECT_DELAY_S = 1.0
"""The longest wait between two attempts to open a server's stream (the gRPC channel's own backoff too)."""

log = logging.getLogger(__name__)

Dispatch = Callable[["ServerConnection", int, server_pb2.ServerMessage | None], Awaitable[None] | None]
"""(connection, partition id, message); message None tells every partition the stream is gone. Returns None when the
message was taken at once (the common case: no coroutine per message), else what to await first (a full inbox)."""


class ServerConnection:
    """A live stream to one server, shared by every partition the client mounts there."""

    def __init__(self, endpoint: str, stream: ServerStream, seq_num: int, max_batch: int) -> None:
        self.endpoint = endpoint
        self.seq_num = seq_num
        self.closed = False
        self.received_any = False
        self._stream = stream
        self._max_batch = max_batch
        # Unbounded on purpose: appends are bounded by the partitions' monitors, and queueing
        # must not await, so that registering an append and queueing it are one step.
        self._out: deque[server_pb2.ClientMessage] = deque()
        self._open: server_pb2.ClientMessage | None = None  # the last queued message, if appends can join it
        self._open_requests: Any = None  # its repeated AppendRequest field: two lookups fewer per append
        self._open_count = 0
        self._idle: asyncio.Future[None] | None = None  # the send loop's while it waits for a message to send

    def enqueue(self, message: server_pb2.ClientMessage) -> None:
        """Queue a message (not an append: see new_append) in order."""
        if not self.closed:
            self._out.append(message)
            self._open = None
            self._wake()

    def new_append(self) -> server_pb2.AppendRequest:
        """A new, empty AppendRequest at the end of the queue, for the caller to fill in now: it
        joins the AppendBatch of the appends queued just before it (up to the batch size), built in
        place, so that nothing is copied into a batch later."""
        return self.new_appends(1)[0]

    def new_appends(self, count: int) -> list[server_pb2.AppendRequest]:
        """new_append() count times, in one call."""
        made: list[server_pb2.AppendRequest] = []
        while count > 0:
            if self._open is None or self._open_count >= self._max_batch:
                message = server_pb2.ClientMessage()
                message.appends.SetInParent()
                if not self.closed:
                    self._out.append(message)
                    self._wake()
                self._open = message
                self._open_requests = message.appends.requests
                self._open_count = 0
            take = min(count, self._max_batch - self._open_count)
            add = self._open_requests.add
            made += [add() for _ in range(take)]
            self._open_count += take
            count -= take
        return made

    def _wake(self) -> None:
        """The send loop, if it waits: it resumes on the loop's next iteration, so what this one queues goes
        together (a batch's appends are queued at once). A bare future: an asyncio.Event's wait and set cost a
        coroutine and a waiter list per round."""
        idle = self._idle
        if idle is not None:
            self._idle = None
            if not idle.done():
                idle.set_result(None)

    async def run(self, dispatch: Dispatch) -> None:
        """Send and receive until the stream fails; then tell the partitions and return."""
        sender = asyncio.ensure_future(self._send_loop())
        try:
            await self._receive_loop(dispatch)
        except StreamClosedError as exc:
            if self.received_any:
                log.info("stream to %s (seq %d) closed: %s", self.endpoint, self.seq_num, exc)
            else:  # the connection attempt itself failed: the application should hear of it
                log.warning("could not open a stream to Waltz server %s (stream %d): %s; trying again",
                            self.endpoint, self.seq_num, exc)
        finally:
            self.closed = True
            sender.cancel()
            await asyncio.gather(sender, return_exceptions=True)
            await self._stream.close()
        waiting = dispatch(self, -1, None)
        if waiting is not None:
            await waiting

    async def _send_loop(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while True:
                if not self._out:
                    self._idle = idle = loop.create_future()
                    await idle  # (_wake)
                while self._out:
                    message = self._out.popleft()
                    if message is self._open:
                        self._open = None  # sent from here on: later appends start a new batch
                    await self._stream.send(message)
        except StreamClosedError:
            await self._stream.close()  # the receive loop then ends too

    async def _receive_loop(self, dispatch: Dispatch) -> None:
        while True:
            message = await self._stream.receive()
            self.received_any = True
            for partition_id, part in message_partitions(message):
                waiting = dispatch(self, partition_id, part)
                if waiting is not None:
                    await waiting


class ConnectionManager:
    """Opens (and reopens, with backoff) the one stream per server endpoint."""

    def __init__(self, driver: Driver, dispatch: Dispatch, tasks: TaskSet, max_batch: int) -> None:
        self._driver = driver
        self._dispatch = dispatch
        self._tasks = tasks
        self._max_batch = max_batch
        self._live: dict[str, ServerConnection] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._failures: dict[str, int] = {}
        self._seq_num = 0
        self.reconnects = 0  # streams opened to an endpoint whose previous stream had ended (metrics)

    async def get(self, endpoint: str) -> ServerConnection:
        """The live connection to endpoint, opened now if needed (raises StreamClosedError)."""
        async with self._locks.setdefault(endpoint, asyncio.Lock()):
            conn = self._live.get(endpoint)
            if conn is not None and not conn.closed:
                return conn
            if conn is not None:
                self.reconnects += 1
            failures = self._failures.get(endpoint, 0)
            if failures:
                await asyncio.sleep(min(MAX_RECONNECT_DELAY_S, 0.05 * 2 ** (failures - 1)))
            self._failures[endpoint] = failures + 1  # reset once the stream delivers something
            self._seq_num += 1
            stream = await self._driver.open_stream(endpoint)
            conn = ServerConnection(endpoint, stream, self._seq_num, self._max_batch)
            self._live[endpoint] = conn
            self._tasks.spawn(self._run(conn), f"waltz-stream-{endpoint}-{conn.seq_num}")
            return conn

    async def _run(self, conn: ServerConnection) -> None:
        failures, forward = self._failures, self._dispatch

        def dispatch(c: ServerConnection, pid: int, msg: server_pb2.ServerMessage | None) -> Awaitable[None] | None:
            if c.received_any and failures.get(c.endpoint):
                failures[c.endpoint] = 0
            return forward(c, pid, msg)

        await conn.run(dispatch)

    async def close(self) -> None:
        for conn in self._live.values():
            conn.closed = True
        self._live.clear()
