"""The client's gRPC driver picks up rotated TLS files: a new channel for the next stream or call."""

from __future__ import annotations

import asyncio

from waltz_client.config import ClientConfig
from waltz_client.grpc_driver import GrpcDriver
from waltz_common import devcerts


def test_changed_files_give_a_new_channel_and_old_ones_close_with_the_client(tmp_path):
    files = devcerts.write(tmp_path)
    config = ClientConfig.of(
        {
            "tls.certFile": str(files["application"]),
            "tls.keyFile": str(files["application-key"]),
            "tls.caFile": str(files["ca"]),
        },
        zookeeper_required=False,
    )
    assert config.tls is not None

    async def scenario() -> None:
        driver = GrpcDriver(config)
        first = driver._channel("127.0.0.1:1")
        assert driver._channel("127.0.0.1:1") is first  # unchanged files: the same channel
        other = driver._channel("127.0.0.1:2")
        cert, key = devcerts.issue(devcerts.new_authority(), "application")
        files["application-key"].write_bytes(key)
        files["application"].write_bytes(cert)
        rotated = driver._channel("127.0.0.1:1")
        assert rotated is not first and driver._channel("127.0.0.1:2") is not other
        assert driver._retired == [first, other]
        await driver.close()
        assert driver._retired == [] and driver._channels == {}

    asyncio.run(scenario())
