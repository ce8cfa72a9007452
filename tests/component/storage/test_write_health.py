"""A storage node's health follows its disk: an append that fails with an I/O error makes its partition (and the
node's readiness) NOT_SERVING with the error, which only an append that succeeds clears (a truncate, which grows
no file, succeeds on a full disk too and proves nothing); a refused request is no disk failure."""

from __future__ import annotations

import asyncio
import errno
from collections.abc import Iterator

import pytest

from tests.component.storage.node_harness import KEY, NodeThread, SessionClient, records
from waltz_common.health import Verdict
from waltz_storage import segment
from waltz_storage.admin_client import StorageAdminClient
from waltz_storage.health import partition_name


@pytest.fixture
def node(tmp_path) -> Iterator[NodeThread]:
    with NodeThread(tmp_path / "storage") as running:
        with StorageAdminClient("127.0.0.1", running.servers.admin_port, str(KEY), 3) as admin:
            admin.assign(0)
        yield running


def test_a_failing_disk_write_is_reported_until_an_append_succeeds(node, monkeypatch):
    disk_full = {"on": False}
    pwrite_all = segment.pwrite_all

    def write(fd: int, data: bytes | bytearray, offset: int) -> None:
        if disk_full["on"]:
            raise OSError(errno.ENOSPC, "No space left on device")
        pwrite_all(fd, data, offset)

    monkeypatch.setattr(segment, "pwrite_all", write)

    def write_failure() -> str:
        with StorageAdminClient("127.0.0.1", node.servers.admin_port, str(KEY), 3) as admin:
            [status] = admin.list_partitions()
        return status.write_failure

    async def scenario() -> None:
        async with SessionClient(node.address) as c:
            await c.open()
            assert (await c.append(0, records(0, 2)))[0] == "success"
            assert node.node.health()[""] == Verdict(True)

            assert (await c.append(0, records(5, 1)))[0] == "failure"  # refused (not consecutive): not the disk
            assert node.node.health()[partition_name(0)] == Verdict(True)

            disk_full["on"] = True
            assert (await c.append(0, records(2, 1)))[0] == "failure"
            health = node.node.health()
            assert not health[""].serving and "No space left on device" in health[""].reason
            assert not health[partition_name(0)].serving
            assert "No space left on device" in await asyncio.to_thread(write_failure)

            assert (await c.ask("truncate", transaction_id=0))[0] == "max_transaction_id"  # works on a full disk
            assert not node.node.health()[partition_name(0)].serving

            disk_full["on"] = False
            assert (await c.append(0, records(1, 1)))[0] == "success"
            assert node.node.health()[""] == Verdict(True)
            assert await asyncio.to_thread(write_failure) == ""

    node.call(scenario())
