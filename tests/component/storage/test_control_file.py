"""ControlFile on real files: creation, checks, locking, dual-slot updates and corruption."""

import os
import subprocess
import sys
import uuid

import pytest

from tests.component.storage.helpers import KEY
from waltz_storage.codec import PartitionInfoStruct, partition_info_struct_offset
from waltz_storage.control_file import CONTROL_FILE_NAME, ControlFile
from waltz_storage.errors import (
    ClusterKeyMismatch,
    PartitionCountMismatch,
    PartitionInfoCorrupted,
    StaleSession,
    StorageDirectoryInUse,
    StorageError,
    UnknownPartition,
)


def flip(path, offset):
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x5A
    path.write_bytes(bytes(data))


def test_create_writes_header_and_fresh_infos(tmp_path):
    ctl = ControlFile.create(tmp_path, KEY, 3)
    ctl.close()
    raw = (tmp_path / CONTROL_FILE_NAME).read_bytes()
    assert len(raw) == 128 + 3 * 60
    with pytest.raises(StorageError, match="already exists"):
        ControlFile.create(tmp_path, KEY, 3)
    ctl = ControlFile.open(tmp_path, KEY, 3)
    assert ctl.num_partitions == 3 and ctl.cluster_key == KEY
    assert ctl.partition_info(2) == PartitionInfoStruct(-1, -1, -1)
    with pytest.raises(UnknownPartition, match=r"partitions are 0\.\.2"):
        ctl.partition_info(3)
    ctl.close()


def test_open_refuses_other_key_or_partition_count(tmp_path):
    ControlFile.create(tmp_path, KEY, 3).close()
    other = uuid.uuid4()
    with pytest.raises(ClusterKeyMismatch, match="another cluster") as refused:
        ControlFile.open(tmp_path, other, 3)
    assert str(KEY) not in str(refused.value) and str(other) not in str(refused.value)
    with pytest.raises(PartitionCountMismatch, match="number of partitions is 3, expected 4"):
        ControlFile.open(tmp_path, KEY, 4)
    ctl = ControlFile.open(tmp_path, KEY, 3)
    with pytest.raises(ClusterKeyMismatch):
        ctl.check_cluster(uuid.uuid4(), 3)
    ctl.close()


def test_second_open_is_refused_in_process_and_across_processes(tmp_path):
    ctl = ControlFile.open_or_create(tmp_path, KEY, 1)
    with pytest.raises(StorageDirectoryInUse, match=f"storage directory {tmp_path} is already in use"):
        ControlFile.open(tmp_path, KEY, 1)
    code = (
        "import sys, uuid; from waltz_storage.control_file import ControlFile\n"
        "from waltz_storage.errors import StorageDirectoryInUse\n"
        f"try: ControlFile.open(sys.argv[1], uuid.UUID('{KEY}'), 1)\n"
        "except StorageDirectoryInUse: sys.exit(3)\n"
    )
    other = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)], env={**os.environ, "PYTHONPATH": ":".join(sys.path)}
    )
    assert other.returncode == 3
    ctl.close()
    ControlFile.open(tmp_path, KEY, 1).close()


def test_updates_alternate_slots_and_survive_reopen(tmp_path):
    ctl = ControlFile.create(tmp_path, KEY, 2)
    path = tmp_path / CONTROL_FILE_NAME
    slot_bytes = []
    for session in (1, 2, 3):
        ctl.set_partition_info(1, PartitionInfoStruct(session, 10 * session, 10 * session - 5))
        raw = path.read_bytes()
        slot_bytes.append([raw[partition_info_struct_offset(1, s) :][:28] for s in (0, 1)])
    assert slot_bytes[0][1] == PartitionInfoStruct(1, 10, 5).encode()
    assert slot_bytes[1][0] == PartitionInfoStruct(2, 20, 15).encode()
    assert slot_bytes[2][1] == PartitionInfoStruct(3, 30, 25).encode()
    ctl.close()
    ctl = ControlFile.open(tmp_path, KEY, 2)
    assert ctl.partition_info(1) == PartitionInfoStruct(3, 30, 25)
    assert ctl.partition_info(0) == PartitionInfoStruct(-1, -1, -1)
    with pytest.raises(StaleSession, match="stale session 2, partition 1 is at session 3"):
        ctl.set_partition_info(1, PartitionInfoStruct(2, 100, 100))
    ctl.close()


def test_corrupt_newest_struct_rolls_back_to_the_other(tmp_path):
    ctl = ControlFile.create(tmp_path, KEY, 2)
    ctl.set_partition_info(0, PartitionInfoStruct(1, 10, 10))  # slot 1
    ctl.set_partition_info(0, PartitionInfoStruct(2, 20, 20))  # slot 0
    ctl.close()
    flip(tmp_path / CONTROL_FILE_NAME, partition_info_struct_offset(0, 0) + 3)
    ctl = ControlFile.open(tmp_path, KEY, 2)
    assert ctl.partition_info(0) == PartitionInfoStruct(1, 10, 10)
    ctl.set_partition_info(0, PartitionInfoStruct(3, 30, 30))  # rewrites the damaged slot
    ctl.close()
    ctl = ControlFile.open(tmp_path, KEY, 2)
    assert ctl.partition_info(0) == PartitionInfoStruct(3, 30, 30)
    ctl.close()


def test_both_structs_corrupt_fails_only_that_partition(tmp_path):
    ctl = ControlFile.create(tmp_path, KEY, 3)
    ctl.set_partition_info(2, PartitionInfoStruct(4, 40, 40))
    ctl.close()
    flip(tmp_path / CONTROL_FILE_NAME, partition_info_struct_offset(1, 0) + 1)
    flip(tmp_path / CONTROL_FILE_NAME, partition_info_struct_offset(1, 1) + 27)
    ctl = ControlFile.open(tmp_path, KEY, 3)
    with pytest.raises(PartitionInfoCorrupted, match="partition 1: both structs fail their checksum"):
        ctl.partition_info(1)
    with pytest.raises(PartitionInfoCorrupted):
        ctl.set_partition_info(1, PartitionInfoStruct(5, 0, 0))
    assert ctl.partition_info(2) == PartitionInfoStruct(4, 40, 40)
    assert ctl.partition_info(0) == PartitionInfoStruct(-1, -1, -1)
    ctl.reset_partition_info(1)
    assert ctl.partition_info(1) == PartitionInfoStruct(-1, -1, -1)
    ctl.close()


def test_truncated_control_file_is_refused(tmp_path):
    ControlFile.create(tmp_path, KEY, 3).close()
    path = tmp_path / CONTROL_FILE_NAME
    path.write_bytes(path.read_bytes()[:200])
    with pytest.raises(StorageError, match="is 200 bytes, expected 308"):
        ControlFile.open(tmp_path, KEY, 3)
