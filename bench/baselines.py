"""Same-run baselines for the append benchmark (raw gRPC echo, the storage node alone) and measurement helpers."""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing as mp
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import grpc
import psutil

from bench.storage_bench import build_requests, pipelined_appends
from waltz.v1 import storage_pb2, storage_pb2_grpc
from waltz_common import event_loop
from waltz_common.testing.local_cluster import LocalCluster

RECORD_BYTES = 512
ECHO_METHOD = "/bench.Echo/Stream"


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# ---------------------------------------------------------------------------------------- memory


class MemorySampler:
    """Samples the RSS of named processes every interval seconds on a thread; keeps each one's peak."""

    def __init__(self, interval: float = 0.2) -> None:
        self._interval = interval
        self._processes: dict[str, list[psutil.Process]] = {}
        self.peak: dict[str, int] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)

    def watch(self, name: str, pid: int) -> None:
        with self._lock:
            self._processes.setdefault(name, []).append(psutil.Process(pid))

    def rss(self, name: str) -> int:
        with self._lock:
            processes = list(self._processes.get(name, []))
        return max((_rss(p) for p in processes), default=0)

    def __enter__(self) -> MemorySampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            with self._lock:
                watched = [(name, p) for name, ps in self._processes.items() for p in ps]
            for name, process in watched:
                rss = _rss(process)
                with self._lock:
                    self.peak[name] = max(self.peak.get(name, 0), rss)


def cpu_seconds(processes: dict[str, psutil.Process]) -> dict[str, float]:
    """CPU seconds (user + system) each process has used so far (0 for one that is gone)."""
    times = {}
    for name, process in processes.items():
        try:
            times[name] = sum(process.cpu_times()[:2])
        except psutil.Error:
            times[name] = 0.0
    return times


def _rss(process: psutil.Process) -> int:
    try:
        return int(process.memory_info().rss)
    except psutil.Error:
        return 0


# ---------------------------------------------------------------------------------------- baselines


def echo_server(conn: Connection) -> None:
    """A grpc.aio bidirectional-stream echo on a free port (sent to conn) until conn receives something."""
    async def main() -> None:
        async def echo(requests: Any, context: Any) -> Any:
            async for request in requests:
                yield request

        handler = grpc.method_handlers_generic_handler(
            "bench.Echo", {"Stream": grpc.stream_stream_rpc_method_handler(echo)}
        )
        server = grpc.aio.server()
        server.add_generic_rpc_handlers((handler,))
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        conn.send(port)
        await asyncio.to_thread(conn.recv)
        await server.stop(0)

    event_loop.run(main())  # the loop the services run on: the floor of their transport


@contextlib.contextmanager
def echo_process() -> Iterator[tuple[str, int]]:
    """(address, pid) of an echo_server in a process of its own, stopped on leaving."""
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    echo = ctx.Process(target=echo_server, args=(child,), daemon=True)
    echo.start()
    try:
        port = parent.recv()
        assert echo.pid is not None
        yield f"127.0.0.1:{port}", echo.pid
    finally:
        parent.send("stop")
        echo.join(30)


async def _echo_client(address: str, serial: int, pipelined: int, window: int) -> tuple[list[float], float]:
    """Round trips one at a time (their latencies), then messages/s with window in flight."""
    payload = os.urandom(RECORD_BYTES)
    async with grpc.aio.insecure_channel(address) as channel:
        call = channel.stream_stream(ECHO_METHOD)()
        latencies = []
        for _ in range(serial):
            started = time.perf_counter()
            await call.write(payload)
            await call.read()
            latencies.append(time.perf_counter() - started)
        slots = asyncio.Semaphore(window)

        async def receive() -> None:
            for _ in range(pipelined):
                await call.read()
                slots.release()

        started = time.perf_counter()
        receiver = asyncio.create_task(receive())
        for _ in range(pipelined):
            await slots.acquire()
            await call.write(payload)
        await receiver
        rate = pipelined / (time.perf_counter() - started)
        await call.done_writing()
    return latencies, rate


@dataclass
class Baselines:
    echo_latencies: list[float]
    echo_rate: float
    storage_latencies: list[float]
    storage_records_rate: float


async def _storage_serial(address: str, cluster_key: str, requests: list[storage_pb2.StorageRequest]) -> list[float]:
    async with grpc.aio.insecure_channel(address) as channel:
        call = storage_pb2_grpc.WaltzStorageStub(channel).Session()
        open_request = storage_pb2.OpenRequest(
            session_id=-1, seq_num=-1, partition_id=-1, cluster_key=cluster_key, num_partitions=1
        )
        await call.write(storage_pb2.StorageRequest(open=open_request))
        await call.read()
        latencies = []
        for request in requests:
            started = time.perf_counter()
            await call.write(request)
            response = await call.read()
            if response.WhichOneof("response") != "success":
                raise RuntimeError(f"append refused: {response}")
            latencies.append(time.perf_counter() - started)
        await call.done_writing()
    return latencies


def run_baselines(
    workdir: Path, zookeeper: str, sampler: MemorySampler, *, echo_serial: int, echo_pipelined: int,
    storage_serial: int, storage_batches: int,
) -> Baselines:
    """Raw gRPC echo (one at a time, then 100 in flight) and the storage node alone (1-record, 100-record)."""
    with echo_process() as (address, _):
        echo_latencies, echo_rate = asyncio.run(_echo_client(address, echo_serial, echo_pipelined, 100))
    with LocalCluster(
        workdir / "storage-alone", storage_nodes=1, servers=0, partitions=1, zookeeper=zookeeper,
        cluster_root="/bench/storage-alone",
    ) as cluster:
        node = cluster.storage[0]
        assert node.pid is not None
        sampler.watch("storage alone (baseline)", node.pid)
        serial = build_requests(0, 1, storage_serial)
        latencies = asyncio.run(_storage_serial(node.connect_string, cluster.cluster_key, serial))
        batched = build_requests(storage_serial, 100, storage_batches)
        for seq, request in enumerate(batched, start=storage_serial):
            request.append.seq_num = seq
        seconds = asyncio.run(pipelined_appends(node.connect_string, cluster.cluster_key, batched, 8))
    return Baselines(echo_latencies, echo_rate, latencies, 100 * storage_batches / seconds)
