"""Client-id spoofing on a mutual TLS cluster, with raw gRPC as an attacker would (issue 25).

The finding: client B (another application certificate) mounted with A's client id, A was told SUPERSEDED, B
committed under A's next ReqId, and A's real append was answered ALREADY_COMMITTED; B could push A's sequence
2^31-1 ahead. Now B's Mount and Append are PERMISSION_DENIED, A is undisturbed, and the binding holds on the
server the partition moves to.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from tests.component.server.grpc_harness import ClientStreamHandle
from tests.component.server.helpers import append, mount, req
from waltz.v1 import server_pb2, server_pb2_grpc
from waltz_common import devcerts, tls
from waltz_common.testing.local_cluster import LocalCluster
from waltz_common.tls import TlsFiles
from waltz_common.types import INT32_MAX

State = server_pb2.MountResponse
Reason = server_pb2.AppendRejected.Reason


@pytest.fixture(scope="module")
def cluster(zookeeper, tmp_path_factory) -> Iterator[LocalCluster]:
    workdir = tmp_path_factory.mktemp("identity-cluster")
    with LocalCluster(
        workdir,
        storage_nodes=1,
        servers=2,
        partitions=1,
        zookeeper=zookeeper.connect_string,
        cluster_root="/test/identity",
        tls=True,
    ) as running:
        yield running


def _application_b(cluster: LocalCluster) -> TlsFiles:
    """A second application certificate of the cluster's CA, with a subject of its own."""
    assert cluster.tls_dir is not None
    d = cluster.tls_dir
    ca = devcerts.Authority(
        x509.load_pem_x509_certificate((d / "ca.pem").read_bytes()),
        serialization.load_pem_private_key((d / "ca-key.pem").read_bytes(), None),  # type: ignore[arg-type]
    )
    cert, key = devcerts.issue(ca, "application", common_name="waltz application B")
    (d / "application-b.pem").write_bytes(cert)
    (d / "application-b-key.pem").write_bytes(key)
    return TlsFiles(str(d / "application-b.pem"), str(d / "application-b-key.pem"), str(d / "ca.pem"))


async def _owner(stub: server_pb2_grpc.WaltzServerStub, not_at: str = "") -> tuple[str, int]:
    """(address, generation) of partition 0's owner once it is owned (and not at not_at)."""
    deadline = time.monotonic() + 60
    while True:
        with_owner = None
        try:
            info = await stub.GetClusterInfo(server_pb2.ClusterInfoRequest(), timeout=5)
            with_owner = info.partitions[0]
        except grpc.aio.AioRpcError:
            pass
        if with_owner is not None and with_owner.address and with_owner.address != not_at:
            return with_owner.address, with_owner.generation
        assert time.monotonic() < deadline, "partition 0 has no owner"
        await asyncio.sleep(0.2)


async def _answer(stream: ClientStreamHandle, kind: str, count: int) -> list:
    await stream.receive_until(lambda h: len(h.of(kind)) >= count)
    return stream.of(kind)


def test_another_application_certificate_cannot_use_a_client_id(cluster):
    a_files, b_files = cluster.tls_files("application"), _application_b(cluster)
    assert a_files is not None

    async def scenario() -> None:
        channels: list[grpc.aio.Channel] = []

        def stub(address: str, files: TlsFiles) -> server_pb2_grpc.WaltzServerStub:
            channels.append(tls.aio_channel(address, files))
            return server_pb2_grpc.WaltzServerStub(channels[-1])

        try:
            any_server = stub(cluster.servers[0].address, a_files)
            address, generation = await _owner(any_server)
            a_stub, b_stub = stub(address, a_files), stub(address, b_files)
            a_id = (await a_stub.GetClientId(server_pb2.ClientIdRequest(), timeout=10)).client_id
            a = ClientStreamHandle(a_stub.Stream())
            await a.send(mount=mount(client_id=a_id, seq=1, generation=generation))
            assert (await _answer(a, "mount", 1))[0].state == State.READY
            await a.send(appends=server_pb2.AppendBatch(requests=[append(a_id, 2, b"A1", generation=generation)]))
            await a.receive_until(lambda h: len(h.fed()) == 1)

            b = ClientStreamHandle(b_stub.Stream())
            await b.send(mount=mount(client_id=a_id, seq=1, generation=generation, net_seq=2))
            denied = (await _answer(b, "mount", 1))[0]
            assert denied.state == State.PERMISSION_DENIED, (
                f"B's mount under A's client id was answered {State.PartitionState.Name(denied.state)}"
            )
            assert f"client id {a_id} belongs to another identity" in denied.message
            forged = [append(a_id, 3, b"forged by B", generation=generation),
                      append(a_id, INT32_MAX, b"B pushes A's sequence", generation=generation)]
            await b.send(appends=server_pb2.AppendBatch(requests=forged))
            refused = await _answer(b, "append_rejected", 2)
            assert [(r.req_id.seq_num, r.reason) for r in refused] == [
                (3, Reason.PERMISSION_DENIED), (INT32_MAX, Reason.PERMISSION_DENIED)
            ]

            mine = [append(a_id, 3, b"A2", generation=generation), append(a_id, 4, b"A3", generation=generation)]
            await a.send(appends=server_pb2.AppendBatch(requests=mine))
            await a.send(flush=server_pb2.FlushRequest(req_id=req(a_id, 4, generation=generation)))
            await a.receive_until(lambda h: len(h.fed()) == 3 and h.of("flush"))
            assert [seq for _, seq in a.fed()] == [2, 3, 4]
            assert a.of("append_rejected") == [] and len(a.of("mount")) == 1  # never told SUPERSEDED
            for transaction_id, expected in zip([t for t, _ in a.fed()], [b"A1", b"A2", b"A3"], strict=True):
                data = await a_stub.GetTransactionData(
                    server_pb2.TransactionDataRequest(req_id=req(a_id, 0, generation=generation),
                                                      transaction_id=transaction_id), timeout=10)
                assert data.success and data.data == expected

            # the partition moves: the next owner reads the binding from ZooKeeper
            for stream in (a, b):
                await stream.call.done_writing()
            owner = next(s for s in cluster.servers if s.address == address)
            other = next(s for s in cluster.servers if s is not owner)
            owner.stop()
            try:
                moved, generation = await _owner(stub(other.address, a_files), not_at=address)
                b2 = ClientStreamHandle(stub(moved, b_files).Stream())
                await b2.send(mount=mount(client_id=a_id, seq=10, generation=generation, net_seq=3))
                assert (await _answer(b2, "mount", 1))[0].state == State.PERMISSION_DENIED
                deadline = time.monotonic() + 60
                while True:  # the new owner answers NOT_READY until it has recovered the partition: mount again
                    a2 = ClientStreamHandle(stub(moved, a_files).Stream())
                    await a2.send(mount=mount(client_id=a_id, seq=10, hwm=-1, generation=generation, net_seq=4))
                    state = (await _answer(a2, "mount", 1))[-1].state
                    if state != State.NOT_READY or time.monotonic() > deadline:
                        break
                    await a2.call.done_writing()
                    await asyncio.sleep(0.2)
                assert state == State.READY
                await a2.send(appends=server_pb2.AppendBatch(requests=[append(a_id, 11, b"A4", generation=generation)]))
                await a2.receive_until(lambda h: 11 in [seq for _, seq in h.fed()])
                for stream in (a2, b2):
                    await stream.call.done_writing()
            finally:
                owner.start()
        finally:
            for channel in channels:
                await channel.close()

    asyncio.run(asyncio.wait_for(scenario(), 180))
