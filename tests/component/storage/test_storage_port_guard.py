"""A storage node's ports against raw gRPC (issue 28): bytes that do not decode get a plain INVALID_ARGUMENT and
one WARNING line, streams beyond the limit a plain RESOURCE_EXHAUSTED, and the node keeps serving; its metrics
include the process's and its build."""

from __future__ import annotations

import asyncio
import logging

import grpc
import pytest

from waltz.v1 import storage_pb2_grpc
from waltz_common.port_guard import LimitMetrics, LimitSettings
from waltz_storage.metrics import StorageMetrics

from ..raw_grpc import ended, plain, raw_stream, sample
from .node_harness import NodeThread, SessionClient


async def _opens(address: str) -> None:
    async with SessionClient(address) as client:
        assert (await client.open())[0] == "success"


@pytest.fixture
def node(tmp_path):
    with NodeThread(tmp_path / "storage", limit_settings=LimitSettings(2, 4, prefix="storage")) as running:
        yield running


def test_undecodable_bytes_get_a_plain_invalid_argument_on_both_ports(node, caplog):
    caplog.set_level(logging.INFO)

    async def scenario():
        async with grpc.aio.insecure_channel(node.address) as channel:
            session = raw_stream(channel, "/waltz.v1.WaltzStorage/Session")
            await session.write(b"\xff\xff\xff not a protobuf")
            code, details = await asyncio.wait_for(ended(session), 10)
            assert code == grpc.StatusCode.INVALID_ARGUMENT, details
            assert "is not a valid waltz.v1.StorageRequest: its bytes do not decode" in details
            assert plain(details), details
        async with grpc.aio.insecure_channel(f"127.0.0.1:{node.servers.admin_port}") as channel:
            admin = raw_stream(channel, "/waltz.v1.WaltzStorageAdmin/Admin")
            await admin.write(b"\xff\xff")
            code, details = await asyncio.wait_for(ended(admin), 10)
            assert code == grpc.StatusCode.INVALID_ARGUMENT, details
            assert "is not a valid waltz.v1.AdminRequest: its bytes do not decode" in details
        await _opens(node.address)  # still serving

    asyncio.run(scenario())
    ours = [r for r in caplog.records if "do not decode" in r.getMessage()]
    assert [r.levelname for r in ours] == ["WARNING", "WARNING"] and not any(r.exc_info for r in ours)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], [r.getMessage() for r in caplog.records]


def test_sessions_beyond_the_limit_are_refused_resource_exhausted(node):
    metrics = LimitMetrics("waltz_storage", node.servers.limits or {}, label="port")

    async def scenario():
        async with grpc.aio.insecure_channel(node.address, options=[("grpc.use_local_subchannel_pool", 1)]) as channel:
            stub = storage_pb2_grpc.WaltzStorageStub(channel)
            held = [stub.Session() for _ in range(2)]
            for _ in range(100):
                if sample(metrics, "waltz_storage_streams", port="storage") == 2:
                    break
                await asyncio.sleep(0.05)
            code, details = await asyncio.wait_for(ended(stub.Session()), 10)
            assert code == grpc.StatusCode.RESOURCE_EXHAUSTED, details
            assert details == (
                "this connection has 2 streams open, the most storage.maxStreamsPerConnection allows: "
                "end some before opening more"
            )
            over = {"port": "storage", "reason": "streams_per_connection"}
            assert sample(metrics, "waltz_storage_calls_refused_total", **over) == 1
            assert sample(metrics, "waltz_storage_connections", port="storage") == 1
            assert sample(metrics, "waltz_storage_streams", port="admin") == 0
            await _opens(node.address)  # another connection is served
            for call in held:
                call.cancel()

    asyncio.run(scenario())


def test_storage_metrics_include_the_process_and_the_build():
    names = {m.name for m in StorageMetrics().registry.collect()}
    assert {"process_resident_memory_bytes", "process_cpu_seconds", "waltz_build_info"} <= names, names
    (info,) = [m for m in StorageMetrics().registry.collect() if m.name == "waltz_build_info"]
    (labels,) = [s.labels for s in info.samples]
    assert labels["component"] == "storage" and labels["version"] and labels["grpcio"] == grpc.__version__
