"""Start-up time against log size: a storage node restarting over a log of N records, and a server taking over
a partition with a log of N transactions.

    .venv/bin/python -m bench.curves.log_size [--quick]

Storage: one node alone, filled with N records of 512 B (encoded appends of 100, pipelined), stopped (SIGTERM)
and started again: time from its start to the answer of a fresh session's Max Transaction ID request (N-1).
Server: a LocalCluster (3 storage replicas, 1 partition) filled with N transactions through its server; the
server is stopped and a new one started: time from its start to the first commit of an append by an
AsyncWaltzClient started with it (the partition's recovery included). The baseline of each is the same with
an empty log, in the same run. Full sizes: 1M and 5M records for the storage node, 1M transactions for the
server (5M through the server takes minutes here); --quick: 100,000 for both.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import grpc

from bench.append_bench import WRITER_CLIENT
from bench.append_writers import Append, CountingCallbacks
from bench.curves.common import LoadLog, fill, main_for, table, verdict
from bench.storage_bench import build_requests, pipelined_appends
from waltz.v1 import storage_pb2, storage_pb2_grpc
from waltz_client import AsyncWaltzClient
from waltz_common.testing.local_cluster import LocalCluster, StorageNode
from waltz_common.testing.zookeeper import ZooKeeperProcess

TARGET_STORAGE_S = 3.0  # a storage node with 1M records serving within 3 s of its start (issue 20)
CHUNK = 2000  # appends of 100 records built at a time


async def _max_transaction_id(address: str, cluster_key: str) -> int:
    async with grpc.aio.insecure_channel(address) as channel:
        call = storage_pb2_grpc.WaltzStorageStub(channel).Session()
        open_request = storage_pb2.OpenRequest(session_id=-1, seq_num=-1, partition_id=-1, cluster_key=cluster_key,
                                               num_partitions=1)
        await call.write(storage_pb2.StorageRequest(open=open_request))
        if (await call.read()).WhichOneof("response") != "success":
            raise RuntimeError("the storage node refused the session")
        request = storage_pb2.MaxTransactionIdRequest(session_id=1, seq_num=0, partition_id=0)
        await call.write(storage_pb2.StorageRequest(max_transaction_id=request))
        response = await call.read()
        await call.done_writing()
    if response.WhichOneof("response") != "max_transaction_id":
        raise RuntimeError(f"unexpected answer {response}")
    return int(response.max_transaction_id.transaction_id)


def _restart_storage(node: StorageNode, cluster_key: str) -> tuple[float, int]:
    node.stop()
    started = time.perf_counter()
    node.start()
    last = asyncio.run(_max_transaction_id(node.connect_string, cluster_key))
    return time.perf_counter() - started, last


def storage_restarts(workdir: Path, zookeeper: str, sizes: tuple[int, ...]) -> list[list[object]]:
    rows: list[list[object]] = []
    with LocalCluster(workdir / "storage", storage_nodes=1, servers=0, partitions=1, zookeeper=zookeeper,
                      cluster_root="/bench/logsize-storage") as cluster:
        node = cluster.storage[0]
        seconds, last = _restart_storage(node, cluster.cluster_key)
        baseline = seconds
        rows.append(["storage node, empty log (baseline)", last + 1, seconds, 1.0, ""])
        held = 0
        for size in sizes:
            while held < size:
                count = min(CHUNK, (size - held) // 100)
                requests = build_requests(held, 100, count, encoded=True)
                for seq, request in enumerate(requests, start=held // 100):
                    request.append.seq_num = seq
                asyncio.run(pipelined_appends(node.connect_string, cluster.cluster_key, requests, 8))
                held += 100 * count
            seconds, last = _restart_storage(node, cluster.cluster_key)
            target = f"<= {TARGET_STORAGE_S:g} s: {verdict(seconds <= TARGET_STORAGE_S)}" if size == 1_000_000 else ""
            rows.append([f"storage node, {size:,} records", last + 1, seconds, seconds / baseline, target])
    return rows


def _takeover(cluster: LocalCluster) -> float:
    """Stop the server, start a new one; seconds from its start to an append's commit."""
    cluster.servers[0].stop()
    cluster.servers.clear()
    started = time.perf_counter()
    cluster.add_server(0)
    config = cluster.client_config(**WRITER_CLIENT)

    async def commit() -> None:
        callbacks = CountingCallbacks(-1)
        async with AsyncWaltzClient(callbacks, {**config, "client.autoMount": False}) as client:
            while True:  # the application's own high-water mark: the log as the partition recovered it
                try:
                    callbacks.hwm = await client.high_water_mark(0)
                    break
                except grpc.aio.AioRpcError as exc:
                    if exc.code() != grpc.StatusCode.UNAVAILABLE:
                        raise
                    await asyncio.sleep(0.02)  # the partition is still recovering on the new server
            client.mount_partitions([0])
            await client.wait_mounted()
            await (await client.submit(Append(b"x" * 512)))

    asyncio.run(asyncio.wait_for(commit(), 120))
    return time.perf_counter() - started


def server_takeovers(workdir: Path, zookeeper: str, size: int) -> list[list[object]]:
    rows: list[list[object]] = []
    with LocalCluster(workdir / "server", zookeeper=zookeeper, cluster_root="/bench/logsize-server") as cluster:
        baseline = _takeover(cluster)
        rows.append(["server takeover, empty log (baseline)", 1, baseline, 1.0, ""])
        rate = fill(cluster, cluster.servers[0].address, 0, size)
        seconds = _takeover(cluster)
        rows.append([f"server takeover, {size:,} transactions (filled at {rate:,.0f}/s)", size + 1, seconds,
                     seconds / baseline, ""])
    return rows


def run(workdir: Path, quick: bool) -> str:
    storage_sizes = (100_000,) if quick else (1_000_000, 5_000_000)
    server_size = 100_000 if quick else 1_000_000
    load = LoadLog()
    with ZooKeeperProcess(workdir / "zookeeper") as zookeeper:
        load.mark("start")
        rows = storage_restarts(workdir, zookeeper.connect_string, storage_sizes)
        load.mark("after the storage restarts")
        rows += server_takeovers(workdir, zookeeper.connect_string, server_size)
        load.mark("end")
    return "\n".join([
        load.line(), "",
        "start-up against log size (512 B records; storage: start to a Max Transaction ID answer; "
        "server: start to the first commit)",
        table(["", "log size", "seconds", "x empty", "target"], rows),
    ])


main = main_for(__doc__.split("\n\n")[0], run)

if __name__ == "__main__":
    raise SystemExit(main(None))
