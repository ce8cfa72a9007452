"""The writer process's part of a committed append on its own: CPU per append of the Python client at N writers,
next to a baseline revision's client in the same run.

    python -m bench.client_append [--baseline REV] [--rounds N] [--writers N] [--seconds S] [--profile]

No cluster and no network: an AsyncWaltzClient (callbacks on the event loop, client.callbackThread false, as
bench.append_bench's writer processes run it) over a Driver whose one server stream answers in process. Every
message the client sends is serialized (what gRPC does in the sender's process); the stand-in server parses it and
answers a mount with READY and every AppendBatch with one feed message committing its appends in order, serialized;
the client parses each answer (what gRPC does in the receiver's process). The server's share is timed apart and
left out, so the figure is the client's Python per append: submit, execute, the AppendRequests, the monitor, the
feed message's apply and the settle, the writers' futures, plus the protobuf serialization and parse. What it
leaves out is gRPC's own per-message work (its C core, the poller thread, the socket), which a batch of ~100
appends shares (bench.append_bench measures the whole).

N writers (default 100) each submit one 512-byte append and await its commit, again and again, as
bench/append_writers.py does. The baseline is another revision (default: `git merge-base HEAD main`), run by that
revision's own checkout and environment (bench/revisions.py, as bench.append_bench --baseline), which runs this
file: the client, its protos and its common package are all the baseline's. Rounds alternate which goes first;
the table shows the best run of each (a busy machine only ever adds time) and the candidate/baseline ratio.

    python -m bench.client_append --instructions N [--baseline REV]

counts instead of timing: each side runs N and then 3N appends under valgrind's callgrind (no warm-up, no window),
and the difference of the two instruction counts over 2N is the instructions per append, which the machine's load
does not change (the stand-in server's share is in it, the same code on both sides). A few minutes per side.
--profile runs the candidate once under cProfile (CPU time) instead.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import os
import pstats
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
ENDPOINT = "bench:1"
CLIENT_ID = 1
RECORD_BYTES = 512


def make_driver() -> Any:
    """The in-process Driver (a class made here: the worker imports the client package it measures first)."""
    from waltz.v1 import server_pb2
    from waltz_client.driver import ClusterInfo, Driver, Ownership, ServerStream

    class EchoServer:
        """The server's side of the stream, timed apart (server_cpu) so that the client's can be told alone."""

        def __init__(self) -> None:
            self.high_water_mark = -1
            self.server_cpu = 0.0
            self.feed_messages = 0

        def answer(self, raw: bytes) -> bytes | None:
            started = time.process_time()
            message = server_pb2.ClientMessage.FromString(raw)
            kind = message.WhichOneof("message")
            answer = server_pb2.ServerMessage()
            if kind == "mount":
                mount = answer.mount
                mount.req_id.CopyFrom(message.mount.req_id)
                mount.partition_ready = True
                mount.state = server_pb2.MountResponse.READY
                mount.high_water_mark = self.high_water_mark
            elif kind == "appends":
                add = answer.feed.transactions.add
                txn_id = self.high_water_mark
                for request in message.appends.requests:
                    txn_id += 1
                    entry = add()
                    entry.req_id.CopyFrom(request.req_id)
                    entry.transaction_id = txn_id
                    entry.header = request.header
                self.high_water_mark = txn_id
                self.feed_messages += 1
            elif kind == "flush":
                answer.flush.req_id.CopyFrom(message.flush.req_id)
                answer.flush.transaction_id = self.high_water_mark
            else:
                answer = None  # type: ignore[assignment]  # a feed request: the feed goes on as it is
            out = None if answer is None else answer.SerializeToString()
            self.server_cpu += time.process_time() - started
            return out

    class EchoStream(ServerStream):
        def __init__(self, server: EchoServer) -> None:
            self._server = server
            self._answers: asyncio.Queue[bytes | None] = asyncio.Queue()

        async def send(self, message: server_pb2.ClientMessage) -> None:
            answer = self._server.answer(message.SerializeToString())
            if answer is not None:
                self._answers.put_nowait(answer)

        async def receive(self) -> server_pb2.ServerMessage:
            raw = await self._answers.get()
            if raw is None:
                from waltz_client.errors import StreamClosedError

                raise StreamClosedError("closed")
            return server_pb2.ServerMessage.FromString(raw)

        async def close(self) -> None:
            self._answers.put_nowait(None)

    class EchoDriver(Driver):
        def __init__(self) -> None:
            self.server = EchoServer()

        async def start(self, on_topology: Callable[[Any], None]) -> ClusterInfo:
            asyncio.get_running_loop().call_soon(on_topology, {0: Ownership(ENDPOINT, 1)})
            return ClusterInfo(CLIENT_ID, 1, "bench")

        async def open_stream(self, endpoint: str) -> ServerStream:
            return EchoStream(self.server)

        async def get_transaction_data(self, endpoint: str, request: Any, timeout: float) -> Any:
            raise AssertionError("the benchmark's application reads no data")

        async def get_high_water_mark(self, endpoint: str, partition_id: int, timeout: float) -> int:
            return self.server.high_water_mark

        async def close(self) -> None:
            pass

    return EchoDriver()


async def run_writers(writers: int, warmup_s: float, seconds: float,
                      profile: cProfile.Profile | None = None, appends: int = 0) -> dict[str, Any]:
    """writers closed-loop writers over the in-process driver: committed appends and CPU (process, server's apart)
    over the measured window. appends > 0: no window, exactly that many appends from the mount on (--instructions)."""
    from waltz_client import AsyncWaltzClient, Transaction, TransactionBuilder, TransactionContext
    from waltz_client.api import WaltzClientCallbacks
    from waltz_common.gctune import tune_for_service

    class Counting(WaltzClientCallbacks):
        def __init__(self) -> None:
            self.hwm = -1

        def get_client_high_water_mark(self, partition_id: int) -> int:
            return self.hwm

        def apply_transaction(self, transaction: Transaction) -> None:
            self.hwm = transaction.transaction_id

    class Append(TransactionContext):
        def __init__(self, payload: bytes) -> None:
            self.payload = payload

        def partition_id(self, num_partitions: int) -> int:
            return 0

        def execute(self, builder: TransactionBuilder) -> bool:
            builder.set_data(self.payload)
            return True

    driver = make_driver()
    callbacks = Counting()
    config = {"client.maxConcurrentTransactions": max(writers, 5), "client.callbackThread": False,
              "client.autoMount": False}
    payload = os.urandom(RECORD_BYTES)
    committed = 0
    async with AsyncWaltzClient(callbacks, config, driver=driver) as client:
        client.mount_partitions([0])
        await client.wait_mounted()
        tune_for_service()  # as bench/append_writers.py: the collector tuned as a busy application would
        begin = time.perf_counter() + warmup_s
        end = begin + seconds
        marks: list[tuple[float, float, int, int]] = []

        if appends:
            begin, end = time.perf_counter(), float("inf")
        left = appends

        async def writer() -> None:
            nonlocal committed, left
            if appends:
                while left > 0:
                    left -= 1
                    await (await client.submit(Append(payload)))
                    committed += 1
                return
            while time.perf_counter() < end:
                await (await client.submit(Append(payload)))
                if begin <= time.perf_counter() < end:
                    committed += 1

        async def measure() -> None:
            for moment in (begin, end):
                await asyncio.sleep(max(0.0, moment - time.perf_counter()))
                marks.append((time.process_time(), driver.server.server_cpu, driver.server.feed_messages,
                              callbacks.hwm))
                if profile is not None:
                    (profile.enable if len(marks) == 1 else profile.disable)()

        if appends:
            marks.append((time.process_time(), driver.server.server_cpu, driver.server.feed_messages, callbacks.hwm))
            await asyncio.gather(*(writer() for _ in range(writers)))
            marks.append((time.process_time(), driver.server.server_cpu, driver.server.feed_messages, callbacks.hwm))
        else:
            measuring = asyncio.get_running_loop().create_task(measure())
            await asyncio.gather(*(writer() for _ in range(writers)))
            await measuring
    if callbacks.hwm != driver.server.high_water_mark:
        raise AssertionError(f"applied up to {callbacks.hwm}, committed up to {driver.server.high_water_mark}")
    (cpu0, server0, feeds0, hwm0), (cpu1, server1, feeds1, hwm1) = marks
    return {"committed": committed, "cpu": (cpu1 - cpu0) - (server1 - server0), "server_cpu": server1 - server0,
            "batch": (hwm1 - hwm0) / max(1, feeds1 - feeds0), "seconds": seconds}


def worker(args: argparse.Namespace) -> None:
    from waltz_common import event_loop

    if args.profile:
        profile = cProfile.Profile(time.process_time)
        event_loop.run(run_writers(args.writers, 1.0, args.seconds, profile))
        pstats.Stats(profile).sort_stats("tottime").print_stats(30)
        return
    result = event_loop.run(run_writers(args.writers, 1.0, args.seconds, appends=args.appends))
    import waltz_client

    result["package"] = str(Path(waltz_client.__file__).parent)
    print(json.dumps(result))


Side = tuple[str, Path, Path | None]
"""How a worker runs one side: its python (a checkout's environment, which imports that checkout's code), its
working directory, and a client package root put first on PYTHONPATH (None: the environment's own)."""


def run_worker(args: argparse.Namespace, python: str, cwd: Path, package_root: Path | None,
               appends: int = 0) -> dict[str, Any]:
    """This file as a worker of one side (Side). appends > 0: that many appends under valgrind's callgrind, whose
    instruction count is returned too."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    if package_root is not None:
        env["PYTHONPATH"] = str(package_root)
    command = [python, str(Path(__file__).resolve()), "--worker", "--writers", str(args.writers),
               "--seconds", str(args.seconds)]
    if appends:
        command = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", *command,
                   "--appends", str(appends)]
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, check=False, timeout=1800)
    if done.returncode != 0:
        raise RuntimeError(f"client worker failed ({done.returncode}):\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    if appends:
        collected = re.search(r"Collected : (\d+)", done.stderr)
        if collected is None:
            raise RuntimeError(f"no instruction count from callgrind:\n{done.stderr[-3000:]}")
        result["instructions"] = int(collected.group(1))
    return result


def instructions_per_append(args: argparse.Namespace, side: Side) -> float:
    """Instructions per append: the difference of two runs, args.instructions and three times as many appends (the
    start-up and the mount cancel out). Counted, not timed: the machine's load does not change it."""
    small = run_worker(args, *side, appends=args.instructions)
    large = run_worker(args, *side, appends=3 * args.instructions)
    return (large["instructions"] - small["instructions"]) / (2 * args.instructions)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline", default=None, help="the baseline revision (default: git merge-base HEAD main)")
    parser.add_argument("--candidate", default=None,
                        help="a named revision's client package as the candidate (default: this checkout's)")
    parser.add_argument("--rounds", type=int, default=3, help="worker runs per revision (alternating order)")
    parser.add_argument("--writers", type=int, default=100, help="closed-loop writers (one append in flight each)")
    parser.add_argument("--seconds", type=float, default=4.0, help="measured seconds per run (after 1 s of warm-up)")
    parser.add_argument("--profile", action="store_true", help="profile the candidate under cProfile instead")
    parser.add_argument("--instructions", type=int, default=0, metavar="N",
                        help="count instructions under valgrind's callgrind instead (runs of N and 3N appends)")
    parser.add_argument("--appends", type=int, default=0, help=argparse.SUPPRESS)  # a worker's fixed count
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker or args.profile:
        worker(args)
        return
    revision = args.baseline or subprocess.run(["git", "-C", str(REPO), "merge-base", "HEAD", "main"],
                                               capture_output=True, text=True, check=True).stdout.strip()
    from bench.revisions import checkout

    base = checkout(revision)
    commit = base.commit
    candidate: Side = (sys.executable, REPO, None)
    candidate_name = "this checkout"
    if args.candidate:  # its client package alone, on this checkout's environment (protos and common: this one's)
        from bench.package_baseline import export

        candidate_commit, root = export(args.candidate, "clients/python", "feed-path")
        candidate, candidate_name = (sys.executable, REPO, root), f"{args.candidate} = {candidate_commit[:12]}"
    sides: dict[str, Side] = {"baseline": (str(base.python), base.path, None), "candidate": candidate}
    if args.instructions:
        counts = {name: instructions_per_append(args, side) for name, side in sides.items()}
        print(f"client append path under callgrind: {args.writers} writers, instructions per append (client and the "
              f"stand-in server: the same server code on both sides), runs of {args.instructions:,} and "
              f"{3 * args.instructions:,} appends")
        print(f"baseline {revision} = {commit[:12]}; candidate = {candidate_name}")
        for name, count in counts.items():
            print(f"{name:<12} {count:>12,.0f}")
        print(f"{'ratio':<12} {counts['candidate'] / counts['baseline']:>12.3f}   (candidate / baseline)")
        return
    runs: dict[str, list[dict[str, Any]]] = {"baseline": [], "candidate": []}
    for r in range(args.rounds):
        for name in ("baseline", "candidate") if r % 2 == 0 else ("candidate", "baseline"):
            python, cwd, package_root = sides[name]
            result = run_worker(args, python, cwd, package_root)
            expected = str((package_root or cwd / "clients/python") / "waltz_client")
            if result["package"] != expected:
                raise RuntimeError(f"the {name} worker imported {result['package']}, not {expected}")
            runs[name].append(result)
    print(f"client append path: {args.writers} writers, {args.seconds:g} s per run, {args.rounds} rounds, best; "
          f"load average {os.getloadavg()[0]:.2f}")
    print(f"baseline {revision} = {commit[:12]}; candidate = {candidate_name}")
    print(f"{'revision':<12} {'appends/s':>10} {'client CPU us/append':>21} {'server us/append':>17} {'batch':>6}")
    rows = {}
    for name, results in runs.items():
        best = min(results, key=lambda x: x["cpu"] / max(1, x["committed"]))
        cpu = best["cpu"] / max(1, best["committed"]) * 1e6
        rate = max(x["committed"] / x["seconds"] for x in results)
        rows[name] = (rate, cpu)
        print(f"{name:<12} {rate:>10,.0f} {cpu:>21.2f} {best['server_cpu'] / max(1, best['committed']) * 1e6:>17.2f} "
              f"{best['batch']:>6.1f}")
    (base_rate, base_cpu), (rate, cpu) = rows["baseline"], rows["candidate"]
    print(f"{'ratio':<12} {rate / base_rate:>10.2f} {cpu / base_cpu:>21.2f}   (candidate / baseline)")


if __name__ == "__main__":
    main()
