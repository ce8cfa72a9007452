"""A fault-injecting TCP proxy for tests: put it between two real processes, then cut, blackhole, delay
or throttle what flows through it.

It runs its own asyncio loop on a thread of its own, so that the faults it makes do not depend on how
busy the test's loop is. Faults apply to the connections open now and to those made later:

- ``cut()``: every connection is reset, and new ones are accepted and closed at once (a refused link);
- ``blackhole()``: connections stay up and new ones are accepted, but nothing flows either way (a
  partition TCP does not notice: the proxy stops reading, so the senders' buffers fill and they stall);
  ``heal()`` lets the held bytes through, as TCP's retransmissions would after a partition heals;
- ``delay(seconds)``: each chunk is forwarded that long after it arrived (order kept);
- ``throttle(bytes_per_second)``: each direction of each connection at most that rate;
- ``heal()``: back to passing everything at once.

Apart from those, ``swallow_next(n)`` makes the next n connections hang: accepted, then never read, answered
or closed (as a server that accepts a connection and forgets it; ZooKeeper 3.8 does so at its start).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

CHUNK = 64 * 1024


def _address(target: str) -> tuple[str, int]:
    host, _, port = target.rpartition(":")
    return host or "127.0.0.1", int(port)


@dataclass(frozen=True)
class Faults:
    """What the proxy does now; replaced as a whole on every change."""

    cut: bool = False
    blackhole: bool = False
    delay_s: float = 0.0
    bytes_per_s: float = 0.0  # 0: no limit

    @property
    def flowing(self) -> bool:
        return not self.cut and not self.blackhole


class FaultProxy:
    """Listens on 127.0.0.1 (a free port unless given) and forwards every connection to target; also: more
    (port, target) pairs forwarded the same way under the same faults (one process's several ports)."""

    def __init__(self, target: str, port: int = 0, name: str = "", also: tuple[tuple[int, str], ...] = ()) -> None:
        self.target = _address(target)
        self.name = name or f"proxy->{target}"
        self._port = port
        self._also = [(p, _address(t)) for p, t in also]
        self._faults = Faults()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.base_events.Server | None = None
        self._also_servers: list[asyncio.base_events.Server] = []
        self._links: set[_Link] = set()
        self._changed: asyncio.Event | None = None
        self._to_swallow = 0
        self._swallowed: list[asyncio.StreamWriter] = []
        self.connections_made = 0

    # lifecycle (from the test's thread)

    def start(self) -> FaultProxy:
        ready = threading.Event()
        failure: list[BaseException] = []

        def serve() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            try:
                loop.run_until_complete(self._listen())
            except BaseException as exc:  # the port was taken: tell start()
                failure.append(exc)
                ready.set()
                return
            ready.set()
            loop.run_forever()
            loop.run_until_complete(self._shutdown())
            loop.close()

        self._thread = threading.Thread(target=serve, name=self.name, daemon=True)
        self._thread.start()
        ready.wait(10)
        if failure:
            raise failure[0]
        return self

    def stop(self) -> None:
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        self._loop = self._thread = None

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        return self._port

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self._port}"

    # faults (from the test's thread)

    def cut(self) -> None:
        self._set(Faults(cut=True))

    def blackhole(self) -> None:
        self._set(Faults(blackhole=True))

    def delay(self, seconds: float) -> None:
        self._set(Faults(delay_s=seconds, bytes_per_s=self._faults.bytes_per_s))

    def throttle(self, bytes_per_second: float) -> None:
        self._set(Faults(delay_s=self._faults.delay_s, bytes_per_s=bytes_per_second))

    def heal(self) -> None:
        self._set(Faults())

    def swallow_next(self, count: int = 1) -> None:
        """The next count connections are accepted and then left hanging until the proxy stops."""

        def apply() -> None:
            self._to_swallow = count

        self._on_loop(apply)

    @property
    def faults(self) -> Faults:
        return self._faults

    def _set(self, faults: Faults) -> None:
        def apply() -> None:
            self._faults = faults
            if faults.cut:
                for link in list(self._links):
                    link.reset()
            assert self._changed is not None
            self._changed.set()
            self._changed = asyncio.Event()

        self._on_loop(apply)

    def _on_loop(self, change: Callable[[], None]) -> None:
        """Run change on the proxy's loop, and return once it has run."""
        loop = self._loop
        if loop is None:
            raise RuntimeError(f"{self.name} is not running")
        done = threading.Event()

        def run() -> None:
            try:
                change()
            finally:
                done.set()

        loop.call_soon_threadsafe(run)
        done.wait(10)

    # the proxy's loop

    async def _listen(self) -> None:
        self._changed = asyncio.Event()
        self._server = await asyncio.start_server(self._accepted, "127.0.0.1", self._port, reuse_address=True)
        self._port = self._server.sockets[0].getsockname()[1]
        for port, target in self._also:
            accept = functools.partial(self._accepted, target=target)
            self._also_servers.append(await asyncio.start_server(accept, "127.0.0.1", port, reuse_address=True))

    async def _shutdown(self) -> None:
        if self._server is not None:
            self._server.close()
        for server in self._also_servers:
            server.close()
        for link in list(self._links):
            link.reset()
        for writer in self._swallowed:
            _reset(writer)
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _accepted(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, target: tuple[str, int] | None = None
    ) -> None:
        self.connections_made += 1
        if self._faults.cut:
            _reset(writer)
            return
        if self._to_swallow > 0:
            self._to_swallow -= 1
            self._swallowed.append(writer)  # held: neither read nor closed
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(*(target or self.target))
        except OSError:
            _reset(writer)
            return
        link = _Link(self, writer, up_writer)
        self._links.add(link)
        try:
            await asyncio.gather(link.pump(reader, up_writer), link.pump(up_reader, writer))
        finally:
            self._links.discard(link)
            link.reset()

    async def wait_flowing(self) -> Faults:
        """The current faults once data may flow (not cut, not blackholed)."""
        while not self._faults.flowing:
            assert self._changed is not None
            await self._changed.wait()
        return self._faults


class _Link:
    """One proxied connection: the client's side and the target's side."""

    def __init__(self, proxy: FaultProxy, client: asyncio.StreamWriter, upstream: asyncio.StreamWriter) -> None:
        self.proxy = proxy
        self.writers = (client, upstream)

    async def pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Read into a queue with arrival times, write from it: a delay is latency, not a rate limit."""
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue(maxsize=64)  # bounded: back-pressure
        sender = asyncio.ensure_future(self._send(queue, writer))
        try:
            with contextlib.suppress(OSError, asyncio.IncompleteReadError):
                while True:
                    await self.proxy.wait_flowing()  # blackholed: nothing is read, the sender stalls
                    data = await reader.read(CHUNK)
                    if not data:
                        break
                    await queue.put((time.monotonic(), data))
            await queue.put((0.0, b""))
            await sender
        finally:
            sender.cancel()

    async def _send(self, queue: asyncio.Queue[tuple[float, bytes]], writer: asyncio.StreamWriter) -> None:
        allowed = 0.0  # throttled: when the next piece may go
        with contextlib.suppress(OSError):
            while True:
                arrived, data = await queue.get()
                if not data:
                    break
                faults = await self.proxy.wait_flowing()
                if faults.delay_s:
                    await asyncio.sleep(max(0.0, arrived + faults.delay_s - time.monotonic()))
                if not faults.bytes_per_s:
                    writer.write(data)
                    await writer.drain()
                    continue
                piece = max(1, int(faults.bytes_per_s / 20))  # smooth: a twentieth of a second's worth at a time
                for start in range(0, len(data), piece):
                    now = time.monotonic()
                    if allowed > now:
                        await asyncio.sleep(allowed - now)
                    allowed = max(now, allowed) + min(piece, len(data) - start) / faults.bytes_per_s
                    writer.write(data[start : start + piece])
                    await writer.drain()
            if writer.can_write_eof():
                writer.write_eof()

    def reset(self) -> None:
        for writer in self.writers:
            _reset(writer)


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with RST (SO_LINGER 0), as a broken link looks to both ends."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    with contextlib.suppress(Exception):
        writer.transport.abort()
