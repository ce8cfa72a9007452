"""How a large frame is written: its 4-byte length and its data as two writes (the baseline, frames.write_frame
before issue 34's framed-port session) against frames.write_frame (one writelines: one writev on uvloop), between
two processes on loopback.

    python -m bench.frame_write [--rounds N] [--frames N] [--bytes N] [--loop uvloop|asyncio]

A reader process (an asyncio.Protocol that counts its data_received calls, answers each frame with a 1-byte frame)
and this process, the writer (a StreamWriter with TCP_NODELAY, as the server's framed session has), one frame at a
time, each waiting for its answer (the serial chain of a round). Each round runs both ways of writing, alternating
which goes first, in a fresh pair of processes; prints the reader's reads (data_received calls) per frame and the
CPU microseconds per frame of each side (process CPU time), the mean of the rounds, and the ratio. Asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Callable
from statistics import mean

from waltz_common import frames

WAYS = ("two writes", "write_frame")


def two_writes(writer: asyncio.StreamWriter, data: bytes) -> None:
    writer.write(len(data).to_bytes(frames.HEADER_BYTES, "big"))
    writer.write(data)


class Counting(asyncio.Protocol):
    """The reader: counts its reads; a frame gets a 1-byte frame back; an empty frame gets the counts back."""

    def __init__(self) -> None:
        self.buffer = bytearray()
        self.reads = 0
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.reads += 1
        self.buffer += data
        assert self.transport is not None
        while len(self.buffer) >= frames.HEADER_BYTES:
            size = int.from_bytes(self.buffer[: frames.HEADER_BYTES], "big")
            if len(self.buffer) < frames.HEADER_BYTES + size:
                break
            del self.buffer[: frames.HEADER_BYTES + size]
            if size:
                self.transport.write(b"\x00\x00\x00\x01x")
            else:  # a report: reads and CPU ns so far
                report = f"{self.reads} {time.process_time_ns()}".encode().ljust(64)
                self.transport.write(report)


async def serve() -> None:
    server = await asyncio.get_running_loop().create_server(Counting, "127.0.0.1", 0)
    print(server.sockets[0].getsockname()[1], flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)


async def write_all(port: int, count: int, size: int) -> dict[str, tuple[float, float, float]]:
    """(reads per frame, writer CPU us, reader CPU us) of each way, in this pair of processes."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    frames.set_keepalive(writer, 10.0)
    data = os.urandom(size)

    async def report() -> tuple[int, int]:
        writer.write(b"\x00\x00\x00\x00")
        reads, cpu = (await reader.readexactly(64)).split()
        return int(reads), int(cpu)

    ways: dict[str, Callable[[asyncio.StreamWriter, bytes], None]] = {
        "two writes": two_writes, "write_frame": frames.write_frame
    }
    results = {}
    for name in WAYS if count % 2 == 0 else WAYS[::-1]:
        write = ways[name]
        for _ in range(count // 10):  # warm-up
            write(writer, data)
            await reader.readexactly(5)
        reads, reader_ns = await report()
        started = time.process_time_ns()
        for _ in range(count):
            write(writer, data)
            await reader.readexactly(5)
        writer_ns = time.process_time_ns() - started
        reads_after, reader_after = await report()
        results[name] = ((reads_after - reads - 1) / count, writer_ns / count / 1000,
                         (reader_after - reader_ns) / count / 1000)
    writer.close()
    return results


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=6, help="pairs of processes, alternating which way goes first")
    parser.add_argument("--frames", type=int, default=3000, help="frames of each way per round")
    parser.add_argument("--bytes", type=int, default=55_216, help="bytes of a frame (default: 100 appends of 512 B)")
    parser.add_argument("--loop", choices=("uvloop", "asyncio"), default="uvloop")
    parser.add_argument("--reader", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    factory = None
    if args.loop == "uvloop":
        import uvloop

        factory = uvloop.new_event_loop
    if args.reader:
        with asyncio.Runner(loop_factory=factory) as runner:
            runner.run(serve())
        return
    rounds = []
    loads = []
    for r in range(args.rounds):
        loads.append(os.getloadavg()[0])
        command = [sys.executable, "-m", "bench.frame_write", "--reader", "--loop", args.loop]
        with subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) as reader:
            assert reader.stdout is not None and reader.stdin is not None
            port = int(reader.stdout.readline())
            with asyncio.Runner(loop_factory=factory) as runner:
                rounds.append(runner.run(write_all(port, args.frames + r % 2, args.bytes)))
            reader.stdin.close()
            reader.wait(10)
    print(f"a frame of {args.bytes:,} B written one at a time, {args.loop}, {args.rounds} rounds of {args.frames} "
          f"frames each way; load average {min(loads):.2f}-{max(loads):.2f}")
    print(f"{'way':<12} {'reads/frame':>12} {'writer us':>10} {'reader us':>10}")
    means = {way: [mean(r[way][i] for r in rounds) for i in range(3)] for way in WAYS}
    for way in WAYS:
        print(f"{way:<12} {means[way][0]:>12.2f} {means[way][1]:>10.1f} {means[way][2]:>10.1f}")
    old, new = means[WAYS[0]], means[WAYS[1]]
    print(f"{'ratio':<12} {new[0] / old[0]:>12.2f} {new[1] / old[1]:>10.2f} {new[2] / old[2]:>10.2f}"
          "   (write_frame / two writes)")


if __name__ == "__main__":
    main()
