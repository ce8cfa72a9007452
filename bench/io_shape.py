"""The I/O shape of a lone append with no Waltz code: the floors under the server's and a storage node's round, for
bench.round's "shape" load.

A lone append's round, as the wire sees it: the server reads one ClientMessage (544 B) from the client's gRPC
stream, writes one frame (573 B, a StorageRequest's size) to each of 3 storage nodes on their framed session port
(length-prefixed, plain TCP), and writes one feed message (600 B) on the client's stream when the 2nd answer
arrives; each node reads its frame, pwrites it, fdatasyncs and answers with a small frame. Here the same traffic
is made by the plainest Python the services' event loop (uvloop) allows, in processes of their own:
- a shape server: a grpc.aio bidirectional-stream server (as bench.baselines' echo server) holding one asyncio
  Protocol connection to each peer (transport.write out, frames cut in data_received, as the server's
  store.framed_session does); messages are bytes (no protobuf), frames carry a round number the answers return;
- peers: an asyncio Protocol server answering each frame with a 16 B frame at once, and, for the storage shape,
  os.pwrite of the frame's payload at the end of a file in a given directory and os.fdatasync first.
The server has two ways of serving a stream (its method's name says which, and how many peers a round uses):
- "Lone": one task reads a message, sends the frames, awaits the quorum's future, writes the reply (one round in
  flight at most: the cheapest lone round);
- "Pipelined": a reader task sends each message's frames as it arrives and a writer task writes the replies
  (several in flight, as a server must allow).
measure() starts the peers and the server, runs rounds of each variant through one stream in this process
(N in flight: a message sent as each reply arrives) and returns each process's CPU seconds over the window.
The same syscalls cost more CPU in a slower round (peers that only slept 0.2-0.5 ms before answering raised the
shape server's CPU per round from 158-178 us to 204-285 us, and the client's with it): the processes fall idle
and are woken more often. So bench.round measures the server with storage peers too, whose latency is the
storage nodes'.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import subprocess
import sys
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import grpc

from bench.curves.common import CpuMeter
from bench.revisions import REPO
from waltz_common import event_loop

HEADER = 4  # the framed session port's length prefix (waltz_common.frames)
MESSAGE_BYTES = 544  # a ClientMessage with one AppendRequest of 512 B
FRAME_BYTES = 573  # a StorageRequest appending one 512 B record
ANSWER_BYTES = 16
REPLY = os.urandom(600)  # a feed message with one 512 B transaction
ROUND_ID = 8
_PAD = bytes(FRAME_BYTES - ROUND_ID - MESSAGE_BYTES)
_FRAME_HEADER = FRAME_BYTES.to_bytes(HEADER, "big")
_ANSWER_HEADER = ANSWER_BYTES.to_bytes(HEADER, "big")
_ANSWER_PAD = bytes(ANSWER_BYTES - ROUND_ID)
SERVICE = "bench.Shape"
MODES = ("Lone", "Pipelined")


class Frames(asyncio.Protocol):
    """Length-prefixed frames cut out of what arrives, each body handed to on_frame in data_received."""

    def __init__(self, on_frame: Callable[[bytes | memoryview], None]) -> None:
        self.on_frame = on_frame
        self.transport: asyncio.Transport | None = None
        self._buffer = bytearray()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # (uvloop's is not an asyncio.Transport)

    def data_received(self, data: bytes) -> None:
        buffer = self._buffer
        if not buffer and len(data) > HEADER and len(data) == HEADER + int.from_bytes(data[:HEADER], "big"):
            self.on_frame(memoryview(data)[HEADER:])  # the common case: one whole frame
            return
        buffer += data
        while len(buffer) >= HEADER:
            end = HEADER + int.from_bytes(buffer[:HEADER], "big")
            if len(buffer) < end:
                return
            body = bytes(buffer[HEADER:end])
            del buffer[:end]
            self.on_frame(body)


class Peer(Frames):
    """A peer's end of one connection: each frame answered at once (written and fdatasync-ed first when fd)."""

    def __init__(self, fd: int | None) -> None:
        super().__init__(self.answer)
        self.fd = fd
        self.offset = 0

    def answer(self, body: bytes | memoryview) -> None:
        if self.fd is not None:
            self.offset += os.pwrite(self.fd, body[ROUND_ID:], self.offset)
            os.fdatasync(self.fd)
        assert self.transport is not None
        self.transport.write(b"".join((_ANSWER_HEADER, body[:ROUND_ID], _ANSWER_PAD)))


async def serve_peer(directory: str | None) -> None:
    """A peer until stdin closes; prints its port. Its file (directory given) is removed on leaving."""
    path = Path(directory) / f"shape-peer-{os.getpid()}" if directory else None
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644) if path is not None else None
    try:
        server = await asyncio.get_running_loop().create_server(lambda: Peer(fd), "127.0.0.1", 0)
        print(json.dumps({"port": server.sockets[0].getsockname()[1]}), flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
        server.close()
    finally:
        if fd is not None and path is not None:
            os.close(fd)
            path.unlink()


class Rounds:
    """The shape server's rounds in flight: a round's frame goes to the first `peers` peers and its done callback
    is called at the answer that makes a majority of them."""

    def __init__(self) -> None:
        self.links: list[Frames] = []
        self.next = 0
        self.open: dict[int, list[Any]] = {}  # round -> [answers short of the quorum, answers to come, done]

    def start(self, message: bytes, peers: int, done: Callable[[None], object]) -> None:
        number = self.next
        self.next += 1
        frame = b"".join((_FRAME_HEADER, number.to_bytes(ROUND_ID, "big"), message, _PAD))
        self.open[number] = [peers // 2 + 1, peers, done]
        for link in self.links[:peers]:
            link.transport.write(frame)  # type: ignore[union-attr]

    def answer(self, body: bytes | memoryview) -> None:
        number = int.from_bytes(body[:ROUND_ID], "big")
        entry = self.open[number]
        entry[1] -= 1
        if not entry[1]:
            del self.open[number]
        entry[0] -= 1
        if not entry[0]:
            with contextlib.suppress(asyncio.InvalidStateError):  # the stream was cancelled meanwhile
                entry[2](None)


def handlers(rounds: Rounds) -> grpc.GenericRpcHandler:
    """The shape server's methods: Lone1, Lone3, Pipelined1, Pipelined3."""

    def lone(peers: int) -> Callable[..., AsyncIterator[bytes]]:
        async def stream(requests: AsyncIterator[bytes], context: Any) -> AsyncIterator[bytes]:
            loop = asyncio.get_running_loop()
            async for message in requests:
                waiter = loop.create_future()
                rounds.start(message, peers, waiter.set_result)
                await waiter
                yield REPLY
        return stream

    def pipelined(peers: int) -> Callable[..., Any]:
        async def stream(requests: AsyncIterator[bytes], context: Any) -> None:
            loop = asyncio.get_running_loop()
            ready: deque[bytes] = deque()
            wake: list[asyncio.Future[None] | None] = [None]

            def done(_: None) -> None:
                ready.append(REPLY)
                waiter = wake[0]
                if waiter is not None and not waiter.done():
                    waiter.set_result(None)

            async def writer() -> None:
                while True:
                    while ready:
                        await context.write(ready.popleft())
                    waiter = wake[0] = loop.create_future()
                    await waiter

            task = asyncio.create_task(writer())
            try:
                async for message in requests:
                    rounds.start(message, peers, done)
            finally:
                task.cancel()
        return stream

    methods = {f"{mode}{peers}": grpc.stream_stream_rpc_method_handler(make(peers))
               for mode, make in zip(MODES, (lone, pipelined), strict=True) for peers in (1, 3)}
    return grpc.method_handlers_generic_handler(SERVICE, methods)


async def serve_shape(ports: list[int]) -> None:
    """The shape server, connected to the peers at ports, until stdin closes; prints its port."""
    loop = asyncio.get_running_loop()
    rounds = Rounds()
    for port in ports:
        _, link = await loop.create_connection(lambda: Frames(rounds.answer), "127.0.0.1", port)
        rounds.links.append(link)
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((handlers(rounds),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    print(json.dumps({"port": port}), flush=True)
    await loop.run_in_executor(None, sys.stdin.read)
    await server.stop(0)


@contextlib.contextmanager
def process(*args: str) -> Iterator[tuple[int, dict[str, Any]]]:
    """(pid, first line) of `python -m bench.io_shape ARGS` (which prints a JSON line), stopped on leaving by
    closing its stdin."""
    command = [sys.executable, "-m", "bench.io_shape", *args]
    with subprocess.Popen(command, cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) as child:
        try:
            assert child.stdout is not None
            yield child.pid, json.loads(child.stdout.readline())
        finally:
            assert child.stdin is not None
            child.stdin.close()
            try:
                child.wait(10)
            except subprocess.TimeoutExpired:
                child.kill()


def measure(variants: list[tuple[str, int, int]], directory: str | None, warmup: float, seconds: float
            ) -> dict[str, dict[str, Any]]:
    """Each variant (mode, peers, in flight), named "MODE PEERS@INFLIGHT": its rounds, wall seconds and the CPU
    seconds of the server, each peer and this process over `seconds` after `warmup`. Three peers, storage ones
    (pwrite and fdatasync in directory) when directory is given."""
    with contextlib.ExitStack() as stack:
        peers = [stack.enter_context(process("--peer", *([directory] if directory else []))) for _ in range(3)]
        server_pid, started = stack.enter_context(process("--server", *(str(p["port"]) for _, p in peers)))
        pids = {"server": server_pid, **{f"peer-{i}": pid for i, (pid, _) in enumerate(peers)}, "client": os.getpid()}
        return {f"{mode} {count}@{inflight}": event_loop.run(rounds_of(
            f"127.0.0.1:{started['port']}", f"/{SERVICE}/{mode}{count}", inflight, warmup, seconds,
            {name: pid for name, pid in pids.items() if not name.startswith("peer-") or int(name[5:]) < count}))
            for mode, count, inflight in variants}


async def rounds_of(address: str, method: str, inflight: int, warmup: float, seconds: float, pids: dict[str, int]
                    ) -> dict[str, Any]:
    message = os.urandom(MESSAGE_BYTES)
    async with grpc.aio.insecure_channel(address) as channel:
        call = channel.stream_stream(method)()
        for _ in range(inflight):
            await call.write(message)
        rounds = 0
        begin = time.perf_counter() + warmup
        end = began = begin + seconds
        meter: CpuMeter | None = None
        while (now := time.perf_counter()) < end:
            if meter is None and now >= begin:
                meter, rounds, began = CpuMeter(pids), 0, now
            await call.read()
            rounds += 1
            await call.write(message)
        used = meter.used() if meter is not None else {}
        wall = time.perf_counter() - began
        call.cancel()
    return {"rounds": rounds, "seconds": wall, "cpu": used}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--peer", nargs="?", const="", default=None, help="serve as a peer (storage: a directory)")
    parser.add_argument("--server", nargs="+", type=int, default=None, help="serve as the server of these peers")
    parser.add_argument("--dir", default=None, help="with neither: measure, storage peers in this directory")
    args = parser.parse_args(argv)
    if args.peer is not None:
        event_loop.run(serve_peer(args.peer or None))
    elif args.server:
        event_loop.run(serve_shape(args.server))
    else:
        variants = [(mode, peers, 1) for peers in (3, 1) for mode in MODES] + [("Pipelined", 3, 10)]
        for name, result in measure(variants, args.dir, 1.0, 3.0).items():
            per = {who: f"{cpu / max(result['rounds'], 1) * 1e6:.1f}" for who, cpu in result["cpu"].items()}
            print(f"{name}: {result['rounds']} rounds, CPU us per round {per}")


if __name__ == "__main__":
    main()
