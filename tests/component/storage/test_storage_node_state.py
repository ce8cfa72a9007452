"""A storage node's state on disk across restarts, over real gRPC and real files: a corrupt control file, a
truncation across segments, and the assignment flags and listing of the admin port."""

from __future__ import annotations

import uuid

import pytest

from tests.component.storage.node_harness import KEY, NodeThread, SessionClient, assert_failure, record, records
from waltz.v1 import storage_pb2
from waltz_storage.admin_client import StorageAdminClient
from waltz_storage.codec import partition_info_struct_offset
from waltz_storage.control_file import CONTROL_FILE_NAME

Code = storage_pb2.StorageRpcException.ErrorCode


def test_both_control_file_structs_corrupt_fails_that_partition_only(tmp_path):
    directory = tmp_path / "storage"
    with NodeThread(directory) as running:
        with StorageAdminClient("127.0.0.1", running.servers.admin_port, str(KEY), 3) as admin:
            admin.assign(0)
            admin.assign(1)

        async def fill():
            async with SessionClient(running.address) as c:
                await c.open()
                for pid in (0, 1):
                    await c.append(pid, records(0, 3))
                    await c.ask("set_low_water_mark", partition_id=pid, low_water_mark=2)

        running.call(fill())
    ctl = directory / CONTROL_FILE_NAME
    raw = bytearray(ctl.read_bytes())
    for slot in (0, 1):
        raw[partition_info_struct_offset(1, slot) + 3] ^= 0xFF
    ctl.write_bytes(bytes(raw))
    with NodeThread(directory) as running:

        async def check():
            async with SessionClient(running.address) as c:
                await c.open()
                assert_failure(await c.ask("max_transaction_id", partition_id=1), Code.CORRUPTED, "corrupted")
                assert_failure(await c.append(1, records(3, 1)), Code.CORRUPTED)
                assert (await c.ask("max_transaction_id", partition_id=0))[1].transaction_id == 2
                assert (await c.append(0, records(3, 1)))[0] == "success"

        running.call(check())
        with StorageAdminClient("127.0.0.1", running.servers.admin_port, str(KEY), 3) as admin:
            listed = {p.partition_id: p for p in admin.list_partitions()}
            assert listed[0].error == "" and listed[0].max_transaction_id == 3 and listed[0].low_water_mark == 2
            assert "corrupted" in listed[1].error


def test_truncate_across_a_segment_boundary(tmp_path):
    directory = tmp_path / "storage"
    with NodeThread(directory, segment_size_threshold=600) as running:
        with StorageAdminClient("127.0.0.1", running.servers.admin_port, str(KEY), 3) as admin:
            admin.assign(0)

        async def scenario():
            async with SessionClient(running.address) as c:
                await c.open()
                for start in range(0, 40, 4):
                    assert (await c.append(0, records(start, 4, size=100)))[0] == "success"
                segments = sorted(p.name for p in (directory / "0").glob("*.seg"))
                assert len(segments) >= 4
                kind, msg = await c.ask("truncate", transaction_id=9)
                assert (kind, msg.transaction_id) == ("max_transaction_id", 9)
                kept = sorted(p.name for p in (directory / "0").glob("*.seg"))
                assert all(int(name[:19]) <= 10 for name in kept) and len(kept) < len(segments)
                assert (await c.append(0, records(10, 4, size=100)))[0] == "success"
                kind, msg = await c.ask("record_list", transaction_id=0, max_records=100)
                assert list(msg.records) == records(0, 14, size=100)

        running.call(scenario())


def test_admin_assignment_flags_and_listing(tmp_path):
    directory = tmp_path / "storage"
    with NodeThread(directory) as running:
        port = running.servers.admin_port
        with pytest.raises(Exception, match="cluster key mismatch") as refused:
            StorageAdminClient("127.0.0.1", port, str(uuid.uuid4()), 3)
        assert refused.value.code == Code.CLUSTER_KEY_MISMATCH
        with StorageAdminClient("127.0.0.1", port, str(KEY), 3) as admin:
            assert admin.list_partitions() == []
            admin.assign(2)
            admin.assign(2)
            with pytest.raises(Exception, match="partition 3 does not exist") as unknown:
                admin.assign(3)
            assert unknown.value.code == Code.UNKNOWN_PARTITION
            with pytest.raises(Exception, match="not assigned"):
                admin.set_readable(1, False)

            async def fill():
                async with SessionClient(running.address) as c:
                    await c.open()
                    await c.append(2, records(0, 4))

            running.call(fill())
            assert [r.transaction_id for r in admin.record_list(2, 1, 2)] == [1, 2]
            admin.set_readable(2, False)
            admin.set_writable(2, False)
            (state,) = admin.list_partitions()
            assert (state.partition_id, state.readable, state.writable, state.max_transaction_id) == (
                2,
                False,
                False,
                3,
            )
            assert admin.record_list(2, 0, 10)[3].data == record(3).data  # admin reads ignore the flags
    with (
        NodeThread(directory) as running,
        StorageAdminClient("127.0.0.1", running.servers.admin_port, str(KEY), 3) as admin,
    ):
        (state,) = admin.list_partitions()
        assert (state.readable, state.writable, state.max_transaction_id) == (False, False, 3)
        admin.unassign(2)
        assert admin.list_partitions() == []
        assert not (directory / "2").exists()
        admin.assign(2)
        assert admin.list_partitions()[0].max_transaction_id == -1
