"""The benchmarks' raw client: a client id taken from ZooKeeper, the high-water mark, and one Waltz stream driven
by hand (appends in batches, the feed counted), without the Python client's machinery (bench.append_bench's
prefill and raw feed rows, the scaling curves)."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from typing import Any

import grpc

from bench.append_writers import PARTITION
from bench.baselines import RECORD_BYTES
from waltz.v1 import common_pb2, metadata_pb2, server_pb2, server_pb2_grpc
from waltz_common import tls
from waltz_common import zk as zkmeta
from waltz_common.testing.local_cluster import LocalCluster
from waltz_common.tls import TlsFiles
from waltz_common.types import crc32

PREFILL_BATCH = 1000  # appends per AppendBatch of raw_stream


def take_client_id(zookeeper: str, root: str, partition: int = PARTITION) -> tuple[int, int]:
    """(a new client id from the cluster's counter, the partition's generation) of the cluster under root."""
    zk = zkmeta.connect(zookeeper)
    try:
        paths = zkmeta.ZkPaths(root)
        counter = zk.Counter(paths.client_ids)
        counter += 1
        assignment = zkmeta.require(zk, paths.server_assignment, metadata_pb2.ServerAssignment)[0]
        generation = next(o.generation for o in assignment.partitions if o.partition_id == partition)
        return int(counter.post_value), generation
    finally:
        zk.stop()
        zk.close()


def _take_client_id(cluster: LocalCluster, partition: int = PARTITION) -> tuple[int, int]:
    return take_client_id(cluster.zookeeper, cluster.paths.root, partition)


async def high_water_mark(address: str, files: TlsFiles | None = None, partition: int = PARTITION) -> int:
    async with tls.aio_channel(address, files) as channel:
        response = await server_pb2_grpc.WaltzServerStub(channel).GetHighWaterMark(
            server_pb2.HighWaterMarkRequest(partition_id=partition), timeout=30
        )
    return int(response.high_water_mark)


async def raw_stream(
    cluster: LocalCluster, client_hwm: int, appends: int, until: int, partition: int = PARTITION,
    address: str | None = None,
) -> tuple[float, int]:
    """Mount at client_hwm over a raw Stream, send `appends` transactions in batches of PREFILL_BATCH, and
    read the feed until transaction `until` (or until the last append shows). Returns (seconds, feed entries)."""
    client_id, generation = _take_client_id(cluster, partition)
    payload = os.urandom(RECORD_BYTES)
    checksum = crc32(payload)

    def req(seq: int) -> common_pb2.ReqId:
        return common_pb2.ReqId(client_id=client_id, generation=generation, partition_id=partition, seq_num=seq)

    async with grpc.aio.insecure_channel(address or cluster.servers[0].address) as channel:
        call = server_pb2_grpc.WaltzServerStub(channel).Stream()
        mount = server_pb2.MountRequest(req_id=req(0), client_high_water_mark=client_hwm, seq_num=1)
        caught_up: list[Any] = []  # the catch-up feed before READY: counted, as the feed after it
        started = await mount_stream(call, mount, on_feed=caught_up.append)
        for first in range(0, appends, PREFILL_BATCH):
            batch = [
                server_pb2.AppendRequest(
                    req_id=req(first + i + 1), client_high_water_mark=client_hwm,
                    data_length=RECORD_BYTES, data=payload, checksum=checksum,
                )
                for i in range(min(PREFILL_BATCH, appends - first))
            ]
            await call.write(server_pb2.ClientMessage(appends=server_pb2.AppendBatch(requests=batch)))
        seen = sum(len(feed.transactions) for feed in caught_up)
        mine = 0
        last = caught_up[-1].transactions[-1].transaction_id if caught_up else client_hwm
        if not appends and last >= until:
            elapsed = time.perf_counter() - started
            call.cancel()
            return elapsed, seen
        while True:
            response = await call.read()
            if response is grpc.aio.EOF:
                raise RuntimeError("the server ended the stream")
            if response.WhichOneof("message") != "feed":
                raise RuntimeError(f"unexpected answer {response}")
            entries = response.feed.transactions
            seen += len(entries)
            last = entries[-1].transaction_id
            if appends:
                mine += sum(1 for t in entries if t.req_id.client_id == client_id)
            if (appends and mine >= appends) or (not appends and last >= until):
                elapsed = time.perf_counter() - started
                call.cancel()
                return elapsed, seen


async def mount_stream(call: Any, mount: server_pb2.MountRequest, timeout: float = 60.0,
                       on_feed: Callable[[Any], None] | None = None) -> float:
    """Send the mount on a raw Stream call and read its answers until READY (again while the partition is still
    opening on the server); returns the perf_counter moment of the mount that was answered READY. The catch-up feed
    that comes before READY (a mount below the partition's high-water mark) goes to on_feed, message by message."""
    deadline = time.perf_counter() + timeout
    while True:
        sent = time.perf_counter()
        await call.write(server_pb2.ClientMessage(mount=mount))
        response = await call.read()
        while response is not grpc.aio.EOF and response.WhichOneof("message") == "feed" and on_feed is not None:
            on_feed(response.feed)
            response = await call.read()
        if response is grpc.aio.EOF:
            raise RuntimeError("the server ended the stream")
        if response.WhichOneof("message") != "mount":
            raise RuntimeError(f"unexpected answer to a mount {response}")
        if response.mount.state == server_pb2.MountResponse.READY:
            return sent
        if response.mount.state != server_pb2.MountResponse.NOT_READY or time.perf_counter() >= deadline:
            raise RuntimeError(f"mount refused: {response.mount}")
        await asyncio.sleep(0.2)  # the partition is still opening on the server
