"""The loads of bench.round, each run in a worker process of its own (`python -m bench.round --worker SPEC`) that
imports the client of the side measured (the baseline's trees first on its PYTHONPATH, or this checkout's):
- "python": N writers of one AsyncWaltzClient in a client process (bench.append_writers), each awaiting its
  submit's commit before the next (N appends in flight);
- "raw": one Stream call driven from the protos, as a client written in another language would drive it: one
  ClientMessage carrying one AppendRequest per append, the next sent when an append's commit shows in the feed
  (N in flight);
- "open": open loop from several client processes (bench.append_writers' fixed schedule);
- "echo": the floor of one grpc.aio bidirectional-stream round (512 B each way, the echo server in a process of
  its own, both on the services' event loop);
- "shape": the I/O shape of a lone append with no Waltz code (bench.io_shape): a grpc.aio stream server sending a
  frame to each of 3 peers on plain TCP per message, the peers storage-like (pwrite + fdatasync) or not.
Every load measures the CPU of the processes it is given (/proc/PID/stat through psutil: all threads) and its own
over a window after a warm-up, and returns a JSON-able dict.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

import grpc

from bench import io_shape
from bench.append_writers import PARTITION, Job, run_clients
from bench.baselines import ECHO_METHOD, RECORD_BYTES, MemorySampler, echo_process, percentile
from bench.curves.common import CpuMeter, CpuWindow
from bench.raw_client import high_water_mark, mount_stream, take_client_id
from waltz.v1 import common_pb2, server_pb2, server_pb2_grpc
from waltz_common import event_loop
from waltz_common.types import crc32


def packages() -> dict[str, str]:
    """Where this process imports the client and common packages from (the baseline's or this checkout's)."""
    import waltz_client
    import waltz_common

    return {"client": str(Path(waltz_client.__file__).parent), "common": str(Path(waltz_common.__file__).parent)}


def python_in_flight(spec: dict[str, Any]) -> dict[str, Any]:
    """spec: config, address, pids, inflight, warmup, seconds."""
    hwm = asyncio.run(high_water_mark(spec["address"]))
    window = CpuWindow(spec["pids"], spec["warmup"], spec["seconds"])
    job = Job(spec["config"], hwm, writers=spec["inflight"], warmup_s=spec["warmup"], run_s=spec["seconds"])
    with MemorySampler() as sampler:
        (result,) = run_clients([job], sampler, window)
    # The client measures itself over the same window (its clock: every thread of its process).
    return {"committed": result.committed, "errors": result.errors, "cpu": {**window.cpu, "client": result.cpu_s}}


def raw_in_flight(spec: dict[str, Any]) -> dict[str, Any]:
    """spec: zookeeper, root, address, pids, inflight, warmup, seconds."""
    return event_loop.run(_raw_in_flight(spec))


async def _raw_in_flight(spec: dict[str, Any]) -> dict[str, Any]:
    client_id, generation = take_client_id(spec["zookeeper"], spec["root"])
    hwm = await high_water_mark(spec["address"])
    payload = os.urandom(RECORD_BYTES)
    checksum = crc32(payload)

    def req(seq: int) -> common_pb2.ReqId:
        return common_pb2.ReqId(client_id=client_id, generation=generation, partition_id=PARTITION, seq_num=seq)

    async with grpc.aio.insecure_channel(spec["address"]) as channel:
        call = server_pb2_grpc.WaltzServerStub(channel).Stream()
        await mount_stream(call, server_pb2.MountRequest(req_id=req(0), client_high_water_mark=hwm, seq_num=1))
        seq = 0

        async def send() -> None:
            nonlocal seq
            seq += 1
            append = server_pb2.AppendRequest(req_id=req(seq), client_high_water_mark=hwm, data_length=RECORD_BYTES,
                                              data=payload, checksum=checksum)
            await call.write(server_pb2.ClientMessage(appends=server_pb2.AppendBatch(requests=[append])))

        for _ in range(spec["inflight"]):
            await send()
        begin = time.perf_counter() + spec["warmup"]
        end = begin + spec["seconds"]
        meter: CpuMeter | None = None
        committed = errors = 0
        while (now := time.perf_counter()) < end:
            if meter is None and now >= begin:
                meter = CpuMeter({**spec["pids"], "client": os.getpid()})
                committed = errors = 0
            response = await call.read()
            if response is grpc.aio.EOF:
                raise RuntimeError("the server ended the stream")
            kind = response.WhichOneof("message")
            if kind == "feed":
                for entry in response.feed.transactions:
                    hwm = entry.transaction_id
                    if entry.req_id.client_id == client_id:
                        committed += 1
                        await send()
            elif kind in ("append_rejected", "lock_failure"):
                errors += 1
                await send()
        used = meter.used() if meter is not None else {}
        call.cancel()
    return {"committed": committed, "errors": errors, "cpu": used}


def open_loop(spec: dict[str, Any]) -> dict[str, Any]:
    """spec: config, address, rate (in all), processes, warmup, seconds."""
    hwm = asyncio.run(high_water_mark(spec["address"]))
    rate = spec["rate"] / spec["processes"]
    jobs = [Job(spec["config"], hwm, rate=rate, warmup_s=spec["warmup"], run_s=spec["seconds"])
            for _ in range(spec["processes"])]
    with MemorySampler() as sampler:
        results = run_clients(jobs, sampler)
    latencies = [x for r in results for x in r.latencies]
    return {
        "committed": sum(r.committed for r in results), "errors": sum(r.errors for r in results),
        "submitted": sum(r.submitted for r in results),
        **{name: percentile(latencies, q) for name, q in (("p50", 0.5), ("p99", 0.99), ("p99.9", 0.999))},
    }


def echo_rounds(spec: dict[str, Any]) -> dict[str, Any]:
    """spec: warmup, seconds. One round at a time; CPU of the echo server and of this process."""
    with echo_process() as (address, pid):
        return event_loop.run(_echo_client(address, pid, spec["warmup"], spec["seconds"]))


async def _echo_client(address: str, pid: int, warmup: float, seconds: float) -> dict[str, Any]:
    payload = os.urandom(RECORD_BYTES)
    async with grpc.aio.insecure_channel(address) as channel:
        call = channel.stream_stream(ECHO_METHOD)()
        rounds = 0
        begin = time.perf_counter() + warmup
        end = begin + seconds
        meter: CpuMeter | None = None
        while (now := time.perf_counter()) < end:
            if meter is None and now >= begin:
                meter = CpuMeter({"server": pid, "client": os.getpid()})
                rounds = 0
            await call.write(payload)
            await call.read()
            rounds += 1
        used = meter.used() if meter is not None else {}
        await call.done_writing()
    return {"rounds": rounds, "cpu": used}


def shape_rounds(spec: dict[str, Any]) -> dict[str, Any]:
    """spec: variants ([mode, peers, in flight], as bench.io_shape.measure), directory (storage peers' files, or
    None: peers without disk), warmup, seconds."""
    variants = [(mode, int(peers), int(inflight)) for mode, peers, inflight in spec["variants"]]
    return {"variants": io_shape.measure(variants, spec["directory"], spec["warmup"], spec["seconds"])}


LOADS = {"python": python_in_flight, "raw": raw_in_flight, "open": open_loop, "echo": echo_rounds,
         "shape": shape_rounds}


def run(spec: dict[str, Any]) -> dict[str, Any]:
    """The load spec["load"] with spec; its result and where this process imported its packages from."""
    return {**LOADS[spec["load"]](spec), "packages": packages()}
