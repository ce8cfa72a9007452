"""Clients given server addresses alone (client.servers), with ZooKeeper unreachable from the client side:
discovery and client ids by RPC, appends and feeds, a partition that moves to a new server, and an append re-sent
to the new owner answered with its original transaction."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from kazoo.client import KazooClient

from tests.component.client.helpers import Ctx, MemoryCallbacks, eventually, run
from waltz.v1 import common_pb2, server_pb2, server_pb2_grpc
from waltz_client import AsyncWaltzClient
from waltz_common.testing.zookeeper import ZooKeeperProcess
from waltz_common.types import crc32

local_cluster = pytest.importorskip("waltz_common.testing.local_cluster")

FAST = {"client.longWaitThresholdSeconds": 0.5, "client.mountTimeout": 60, "client.requestTimeout": 60,
        "client.discoveryIntervalSeconds": 0.2}


@pytest.fixture(scope="module")
def cluster(zookeeper: ZooKeeperProcess, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    root = f"/test/{uuid.uuid4().hex[:12]}"
    workdir: Path = tmp_path_factory.mktemp("servers-only")
    with local_cluster.LocalCluster(
        workdir, storage_nodes=3, servers=1, partitions=2, cluster_root=root, zookeeper=zookeeper.connect_string
    ) as c:
        yield c


@pytest.fixture
def no_zookeeper(monkeypatch: pytest.MonkeyPatch) -> None:
    """ZooKeeper is out of the client side's reach: starting any session here fails (the servers run elsewhere)."""

    def refuse(self: KazooClient, *args: object, **kwargs: object) -> None:
        raise AssertionError("the client side tried to reach ZooKeeper")

    monkeypatch.setattr(KazooClient, "start", refuse)


async def cluster_info(address: str) -> server_pb2.ClusterInfoResponse:
    async with grpc.aio.insecure_channel(address) as channel:
        stub = server_pb2_grpc.WaltzServerStub(channel)
        return await stub.GetClusterInfo(server_pb2.ClusterInfoRequest(), timeout=10)


def test_any_server_tells_the_cluster_and_hands_out_client_ids(cluster: Any, no_zookeeper: None) -> None:
    address = cluster.servers[0].address

    async def main() -> None:
        info = await cluster_info(address)
        for _ in range(100):  # a server is up before the coordinator's assignment reaches it (a busy machine)
            if all(p.address for p in info.partitions):
                break
            await asyncio.sleep(0.2)
            info = await cluster_info(address)
        assert info.num_partitions == 2 and [p.partition_id for p in info.partitions] == [0, 1]
        assert all(p.address == address and p.generation >= 1 for p in info.partitions), info
        assert info.limits.max_message_bytes >= 16 * 1024 * 1024
        assert info.limits.max_transaction_bytes == 1048576 and info.limits.max_batch_appends == 2000
        assert info.limits.max_locks_per_append == 256
        async with grpc.aio.insecure_channel(address) as channel:
            stub = server_pb2_grpc.WaltzServerStub(channel)
            ids = [(await stub.GetClientId(server_pb2.ClientIdRequest(), timeout=10)).client_id for _ in range(3)]
        assert ids == sorted(set(ids)) and ids[0] >= 1

    run(main())


def test_the_client_works_from_server_addresses_alone(cluster: Any, no_zookeeper: None) -> None:
    config = {"client.servers": cluster.servers[0].address, **FAST}

    async def main() -> None:
        writer_cb, reader_cb = MemoryCallbacks(), MemoryCallbacks()
        async with AsyncWaltzClient(writer_cb, config) as writer, AsyncWaltzClient(reader_cb, config) as reader:
            assert writer.num_partitions == 2 and writer.client_id != reader.client_id
            await writer.wait_mounted()
            await reader.wait_mounted()
            base = {p: await writer.high_water_mark(p) for p in (0, 1)}
            futures = [await writer.submit(Ctx(b"s%d" % i, partition=i % 2)) for i in range(20)]
            assert await asyncio.gather(*futures) == [True] * 20
            await eventually(lambda: all(reader.client_high_water_mark(p) == base[p] + 10 for p in (0, 1)), 30)
        assert reader_cb.applied == writer_cb.applied  # the reader fetched the data by RPC

    run(main())


def test_the_cli_client_commands_work_from_server_addresses_alone(
    cluster: Any, no_zookeeper: None, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    from waltz_cli.main import main as waltz

    servers = f"127.0.0.1:1,{cluster.servers[0].address}"  # the first does not answer: the next one is asked
    assert waltz(["--server-addresses", servers, "--json", "client", "high-water-mark"]) == 0
    marks = json.loads(capsys.readouterr().out)
    assert set(marks) == {"0", "1"} and all(m >= 9 for m in marks.values())  # the previous test's 10 each
    assert waltz(["--server-addresses", servers, "--json", "client", "tail", "-p", "1", "-n", "2"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["transaction_id"] for r in lines] == [marks["1"] - 1, marks["1"]]
    argv = ["--server-addresses", servers, "--json", "client", "validate", "-n", "10", "-p", "0"]
    assert waltz(argv) == 0, capsys.readouterr()
    assert json.loads(capsys.readouterr().out)["passed"] is True
    assert waltz(["--server-addresses", servers, "cluster", "list"]) == 2  # the ZooKeeper commands say what they need
    assert "no ZooKeeper given" in capsys.readouterr().err


class RawStream:
    """A client stream written by hand, as another language would."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        self.call = server_pb2_grpc.WaltzServerStub(channel).Stream()
        self.seen: list[server_pb2.ServerMessage] = []

    async def send(self, **message: Any) -> None:
        await self.call.write(server_pb2.ClientMessage(**message))

    async def until(self, done: Any) -> None:
        while not done(self.seen):
            message = await asyncio.wait_for(self.call.read(), 30)
            assert message is not grpc.aio.EOF
            self.seen.append(message)


def _append(client_id: int, generation: int, pid: int, seq: int, data: bytes) -> server_pb2.AppendRequest:
    req = common_pb2.ReqId(client_id=client_id, generation=generation, partition_id=pid, seq_num=seq)
    return server_pb2.AppendRequest(req_id=req, client_high_water_mark=-1, data_length=len(data), data=data,
                                    checksum=crc32(data))


async def _mount(stream: RawStream, client_id: int, generation: int, pid: int, seq: int, net: int) -> int:
    req = common_pb2.ReqId(client_id=client_id, generation=generation, partition_id=pid, seq_num=seq)
    await stream.send(mount=server_pb2.MountRequest(req_id=req, client_high_water_mark=-1, seq_num=net))
    await stream.until(lambda seen: any(m.WhichOneof("message") == "mount" and m.mount.req_id == req for m in seen))
    [answer] = [m.mount for m in stream.seen if m.WhichOneof("message") == "mount" and m.mount.req_id == req]
    assert answer.state == server_pb2.MountResponse.READY, answer
    return int(answer.high_water_mark)


@pytest.mark.slow
def test_a_partition_moves_and_clients_follow_and_a_resend_is_answered_by_the_new_owner(
    cluster: Any, no_zookeeper: None
) -> None:
    first = cluster.servers[0].address
    config = {"client.servers": first, **FAST}

    async def main() -> None:
        callbacks = MemoryCallbacks()
        async with AsyncWaltzClient(callbacks, config) as client, grpc.aio.insecure_channel(first) as ch0:
            await client.wait_mounted()
            before = [await client.submit(Ctx(b"b%d" % i, partition=i % 2)) for i in range(10)]
            assert await asyncio.gather(*before) == [True] * 10
            stub = server_pb2_grpc.WaltzServerStub(ch0)
            cid = (await stub.GetClientId(server_pb2.ClientIdRequest(), timeout=10)).client_id
            old_generation = {p.partition_id: p.generation for p in (await cluster_info(first)).partitions}
            raw = RawStream(ch0)
            for pid in (0, 1):
                await _mount(raw, cid, old_generation[pid], pid, 0, 1)
                await raw.send(appends=server_pb2.AppendBatch(requests=[
                    _append(cid, old_generation[pid], pid, seq, b"raw%d" % seq) for seq in (1, 2)]))
            await raw.until(lambda seen: len(_fed_all(seen, cid)) == 4)
            committed = _fed_all(raw.seen, cid)

            await asyncio.to_thread(cluster.add_server)  # the coordinator gives the new server a partition
            second = cluster.servers[1].address

            async def moved() -> server_pb2.PartitionOwner:
                while True:
                    for owner in (await cluster_info(first)).partitions:
                        if owner.address == second:
                            return owner
                    await asyncio.sleep(0.1)

            owner = await asyncio.wait_for(moved(), 60)
            pid = owner.partition_id
            assert owner.generation > old_generation[pid]

            after = [await client.submit(Ctx(b"a%d" % i, partition=i % 2)) for i in range(10)]  # it follows
            assert await asyncio.gather(*after) == [True] * 10

            async with grpc.aio.insecure_channel(second) as ch1:
                fresh = RawStream(ch1)
                hwm = await _mount(fresh, cid, owner.generation, pid, 3, 2)
                resent = _append(cid, old_generation[pid], pid, 2, b"raw2")  # as first sent: old generation
                await fresh.send(appends=server_pb2.AppendBatch(requests=[resent]))
                await fresh.until(lambda seen: any(m.WhichOneof("message") == "append_rejected" for m in seen))
                [answer] = [m.append_rejected for m in fresh.seen if m.WhichOneof("message") == "append_rejected"]
                assert answer.reason == server_pb2.AppendRejected.ALREADY_COMMITTED
                assert answer.transaction_id == committed[(pid, 2)]
                info = await cluster_info(second)
                async with grpc.aio.insecure_channel(second) as ch:
                    mark = await server_pb2_grpc.WaltzServerStub(ch).GetHighWaterMark(
                        server_pb2.HighWaterMarkRequest(partition_id=pid), timeout=10)
                assert mark.high_water_mark == hwm  # not committed again
                assert info.partitions[pid].address == second

            expected = sorted([b"b%d" % i for i in range(10)] + [b"a%d" % i for i in range(10)])
            await eventually(lambda: mine(callbacks) == expected, 30)  # none lost, none doubled

    asyncio.run(asyncio.wait_for(main(), 180))


def mine(callbacks: MemoryCallbacks) -> list[bytes]:
    return sorted(d for p in (0, 1) for _, d in callbacks.applied.get(p, []) if d[:1] in (b"a", b"b"))


def _fed_all(seen: list[server_pb2.ServerMessage], client_id: int) -> dict[tuple[int, int], int]:
    """(partition, seq) -> transaction id of this client's fed transactions."""
    return {(f.req_id.partition_id, f.req_id.seq_num): f.transaction_id for m in seen
            if m.WhichOneof("message") == "feed" for f in m.feed.transactions if f.req_id.client_id == client_id}
