"""A lost server or ZooKeeper is tried again about every second, and reached soon after it is back.

gRPC's channel backs off between connection attempts on its own: 1 s, then 1.6 times more after every failure, up
to 120 s. The client keeps one channel per server for ever, so after a server had been unreachable for a while the
channel tried again only every 5, 10, 20 s... and a server back meanwhile stayed unreachable that long. That is what
a graceful restart did: the stopping server's GOAWAY starts the backoff at the beginning of its 10 s grace period,
and the clients reached the restarted server 5-10 s after it was ready, with every append to its partitions (and a
round-robin writer's others with them) stalled meanwhile.

kazoo does the same for ZooKeeper, doubling from 0.1 s up to an hour: after ZooKeeper was down for 30 s every
server, storage node and client reconnected up to 20 s after it was back, servers holding appends meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

import grpc
from kazoo.protocol.states import KazooState

from waltz.v1 import server_pb2, server_pb2_grpc
from waltz_client.config import ClientConfig
from waltz_client.grpc_driver import GrpcDriver
from waltz_common import zk as zkmeta
from waltz_common.testing.fault_proxy import FaultProxy
from waltz_common.testing.zookeeper import ZooKeeperProcess

OUTAGE_S = 12.0


class HighWaterMarks(server_pb2_grpc.WaltzServerServicer):
    async def GetHighWaterMark(
        self, request: server_pb2.HighWaterMarkRequest, context: grpc.aio.ServicerContext
    ) -> server_pb2.HighWaterMarkResponse:
        return server_pb2.HighWaterMarkResponse(partition_id=request.partition_id, high_water_mark=7)


def test_a_client_tries_a_lost_server_again_every_second_and_reaches_it_soon_after_it_is_back() -> None:
    async def scenario() -> tuple[int, float]:
        server = grpc.aio.server()
        server_pb2_grpc.add_WaltzServerServicer_to_server(HighWaterMarks(), server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        driver = GrpcDriver(ClientConfig.of({}, zookeeper_required=False))
        try:
            with FaultProxy(f"127.0.0.1:{port}") as proxy:
                assert await driver.get_high_water_mark(proxy.address, 0, 5) == 7
                proxy.cut()  # as the server going away: its connections reset, new ones refused
                before = proxy.connections_made
                cut_until = time.monotonic() + OUTAGE_S
                while time.monotonic() < cut_until:  # the client keeps asking, as a mounting partition does
                    with contextlib.suppress(grpc.aio.AioRpcError):
                        await driver.get_high_water_mark(proxy.address, 0, 1)
                    await asyncio.sleep(0.05)
                attempts = proxy.connections_made - before
                proxy.heal()
                healed = time.monotonic()
                while True:
                    try:
                        await driver.get_high_water_mark(proxy.address, 0, 1)
                        break
                    except grpc.aio.AioRpcError:
                        assert time.monotonic() - healed < 60, "the server was never reached again"
                        await asyncio.sleep(0.05)
                return attempts, time.monotonic() - healed
        finally:
            await driver.close()
            await server.stop(0)

    attempts, took = asyncio.run(scenario())
    print(f"[reconnect] {attempts} connection attempts in a {OUTAGE_S:g} s outage; reached {took:.2f} s after it ended")
    # gRPC's own backoff alone makes 5 or 6 attempts in 12 s (at about 0, 1, 2.6, 5.2, 9.3 s)
    assert attempts >= OUTAGE_S * 0.75, f"only {attempts} connection attempts in {OUTAGE_S:g} s"
    assert took < 2.5, f"the server was reached {took:.1f} s after it was back"


def test_a_zookeeper_client_tries_a_lost_zookeeper_again_every_second_and_reconnects_soon_after_it_is_back(
    zookeeper: ZooKeeperProcess,
) -> None:
    with FaultProxy(zookeeper.connect_string) as proxy:
        zk = zkmeta.connect(proxy.address, session_timeout_s=60)
        try:
            proxy.cut()
            before = proxy.connections_made
            time.sleep(OUTAGE_S)
            attempts = proxy.connections_made - before
            assert zk.state != KazooState.CONNECTED
            proxy.heal()
            healed = time.monotonic()
            while zk.state != KazooState.CONNECTED:
                assert time.monotonic() - healed < 60, "ZooKeeper was never reached again"
                time.sleep(0.02)
            took = time.monotonic() - healed
        finally:
            zk.stop()
            zk.close()
    print(f"[reconnect] kazoo: {attempts} connection attempts in a {OUTAGE_S:g} s outage; back {took:.2f} s after it")
    # kazoo's own backoff alone makes about 6 attempts in 12 s (at about 0.1, 0.3, 0.7, 1.5, 3.1, 6.3 s)
    assert attempts >= OUTAGE_S * 0.75, f"only {attempts} connection attempts in {OUTAGE_S:g} s"
    assert took < 2.5, f"ZooKeeper was reached {took:.1f} s after it was back"
