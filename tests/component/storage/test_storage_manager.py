"""StorageManager on real files: assignment, per-partition failures, cluster checks and locking."""

import uuid

import pytest

from tests.component.storage.helpers import KEY, make_records, open_manager
from waltz_storage.codec import partition_info_struct_offset
from waltz_storage.control_file import CONTROL_FILE_NAME
from waltz_storage.errors import (
    ClusterKeyMismatch,
    PartitionCountMismatch,
    PartitionInfoCorrupted,
    PartitionNotAssigned,
    StorageDirectoryInUse,
    UnknownPartition,
)
from waltz_storage.partition import SessionInfo
from waltz_storage.storage_manager import StorageManager


def test_assign_unassign_and_lookup_errors(tmp_path):
    with open_manager(tmp_path, num_partitions=3) as manager:
        assert manager.assigned_partitions() == []
        with pytest.raises(PartitionNotAssigned, match="partition 1 is not assigned"):
            manager.partition(1)
        for bad in (-1, 3):
            with pytest.raises(UnknownPartition, match=f"partition {bad} does not exist"):
                manager.partition(bad)
            with pytest.raises(UnknownPartition):
                manager.assign(bad)
        partition = manager.assign(1)
        assert manager.assign(1) is partition
        partition.append(make_records(0, 4))
        partition.set_low_water_mark(2, 3)
        manager.assign(2)
        assert manager.assigned_partitions() == [1, 2]
    with open_manager(tmp_path, num_partitions=3) as manager:
        assert manager.assigned_partitions() == [1, 2]
        assert manager.partition(1).max_transaction_id == 3
        manager.unassign(1)
        manager.unassign(0)  # not assigned: nothing to do
        assert not (tmp_path / "1").exists()
        assert manager.assigned_partitions() == [2]
        with pytest.raises(PartitionNotAssigned):
            manager.partition(1)
        fresh = manager.assign(1)
        assert fresh.max_transaction_id == -1
        assert fresh.last_session_info() == SessionInfo(-1, -1, -1)


def test_both_control_structs_corrupt_fails_only_that_partition(tmp_path):
    with open_manager(tmp_path, num_partitions=2) as manager:
        for pid in (0, 1):
            manager.assign(pid).append(make_records(0, 3))
    ctl = tmp_path / CONTROL_FILE_NAME
    raw = bytearray(ctl.read_bytes())
    for slot in (0, 1):
        raw[partition_info_struct_offset(1, slot) + 5] ^= 0xFF
    ctl.write_bytes(bytes(raw))
    with open_manager(tmp_path, num_partitions=2) as manager:
        assert manager.assigned_partitions() == [0, 1]
        with pytest.raises(PartitionInfoCorrupted, match="partition 1: both structs fail their checksum"):
            manager.partition(1)
        assert manager.partition(0).records(0, 10) == make_records(0, 3)
        manager.partition(0).append(make_records(3, 1))
        manager.unassign(1)  # an admin repairs it by reassigning
        assert manager.assign(1).max_transaction_id == -1


def test_cluster_key_and_partition_count_are_checked(tmp_path):
    open_manager(tmp_path, num_partitions=2).close()
    with pytest.raises(ClusterKeyMismatch):
        StorageManager(tmp_path, uuid.uuid4(), 2)
    with pytest.raises(PartitionCountMismatch):
        StorageManager(tmp_path, KEY, 3)
    with open_manager(tmp_path, num_partitions=2) as manager:
        manager.check_cluster(KEY, 2)
        with pytest.raises(ClusterKeyMismatch):
            manager.check_cluster(uuid.uuid4(), 2)


def test_two_managers_on_one_directory_are_refused(tmp_path):
    with open_manager(tmp_path) as manager:
        manager.assign(0)
        with pytest.raises(StorageDirectoryInUse, match=f"storage directory {tmp_path} is already in use"):
            open_manager(tmp_path)
    open_manager(tmp_path).close()


def test_segment_of_another_cluster_fails_that_partition(tmp_path):
    other = tmp_path / "other"
    with StorageManager(other, uuid.uuid4(), 2) as manager:
        manager.assign(0).append(make_records(0, 2))
    with open_manager(tmp_path / "mine") as manager:
        manager.assign(0)
        manager.assign(1).append(make_records(0, 1))
    (tmp_path / "mine" / "0" / f"{0:019d}.seg").write_bytes((other / "0" / f"{0:019d}.seg").read_bytes())
    with open_manager(tmp_path / "mine") as manager:
        with pytest.raises(ClusterKeyMismatch, match=r"\.seg: belongs to another cluster"):
            manager.partition(0)
        assert manager.partition(1).max_transaction_id == 0


def test_interrupted_assign_leaves_an_unassigned_directory(tmp_path):
    with open_manager(tmp_path) as manager:
        manager.assign(0).append(make_records(0, 2))
    (tmp_path / "0" / "partition.json").unlink()  # as if assign died before its last step
    with open_manager(tmp_path) as manager:
        assert manager.assigned_partitions() == []
        assert manager.assign(0).max_transaction_id == -1
