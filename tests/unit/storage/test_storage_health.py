"""A storage node's write failures and health names (waltz_storage.health)."""

from __future__ import annotations

import errno

from waltz_common.health import Verdict
from waltz_storage.errors import PartitionNotWritable, StorageError
from waltz_storage.health import (
    ADMIN_SERVICE,
    LIVE,
    SERVICE,
    WriteFailures,
    ZkView,
    is_disk_failure,
    partition_name,
    storage_verdicts,
)


def _wrapped_disk_error() -> StorageError:
    try:
        try:
            raise OSError(errno.EFBIG, "File too large")
        except OSError as e:
            raise StorageError("0.seg: append of 5..9 failed: [Errno 27] File too large") from e
    except StorageError as wrapped:
        return wrapped


def test_disk_failures_are_os_errors_wrapped_or_not():
    assert is_disk_failure(OSError(errno.ENOSPC, "No space left on device"))
    assert is_disk_failure(_wrapped_disk_error())
    assert not is_disk_failure(PartitionNotWritable("partition 1 is not writable"))
    assert not is_disk_failure(StorageError("partition 1 is closed"))


def test_a_write_failure_lasts_until_a_write_succeeds():
    failures = WriteFailures()
    failures.succeeded(1)
    assert failures.snapshot() == {}
    failures.failed(1, _wrapped_disk_error())
    failures.failed(2, OSError(errno.EIO, "I/O error"))
    assert "File too large" in failures.get(1)
    assert failures.get(3) == ""
    failures.succeeded(1)
    assert failures.snapshot() == {2: "[Errno 5] I/O error"}


def test_every_partition_open_and_writing_is_serving():
    verdicts = storage_verdicts([0, 2], {}, {})
    assert set(verdicts) == {"", SERVICE, ADMIN_SERVICE, LIVE, partition_name(0), partition_name(2)}
    assert all(v == Verdict(True) for v in verdicts.values())
    assert partition_name(2) == "waltz.v1.WaltzStorage/partition/2"


def test_a_failing_write_makes_the_node_and_its_partition_not_ready():
    verdicts = storage_verdicts([0, 1], {}, {1: "[Errno 27] File too large"})
    assert verdicts[partition_name(0)] == Verdict(True)
    assert verdicts[partition_name(1)] == Verdict(False, "writes fail: [Errno 27] File too large")
    for name in ("", SERVICE, ADMIN_SERVICE):
        assert verdicts[name] == Verdict(False, "partition 1 writes fail: [Errno 27] File too large")
    assert verdicts[LIVE] == Verdict(True)


def test_a_partition_that_cannot_be_opened_is_reported_and_unassigned_ones_are_not():
    verdicts = storage_verdicts([0], {0: "both control file structs are damaged"}, {5: "old failure"})
    assert verdicts[partition_name(0)] == Verdict(False, "cannot be opened: both control file structs are damaged")
    assert partition_name(5) not in verdicts
    assert not verdicts[""].serving


def test_no_partitions_is_ready():
    assert storage_verdicts([], {}, {})[""] == Verdict(True)


def test_a_partition_zookeeper_assigns_but_the_node_does_not_hold_is_not_ready():
    """A wiped node holds none of its partitions: not ready until they are created and caught up."""
    wiped = storage_verdicts([], {}, {}, ZkView(frozenset({0, 1}), frozenset()))
    assert not wiped[""].serving and not wiped[partition_name(0)].serving
    assert "assigned to this node in ZooKeeper but not held here" in wiped[partition_name(1)].reason
    assert "partition 0" in wiped[""].reason and "partition 1" in wiped[""].reason


def test_a_held_partition_is_ready_once_the_current_store_session_counts_it_in():
    view = ZkView(frozenset({0, 1}), frozenset({0}))
    behind = storage_verdicts([0, 1], {}, {}, view)
    assert behind[partition_name(0)].serving and not behind[partition_name(1)].serving
    assert "not caught up" in behind[partition_name(1)].reason and not behind[""].serving
    caught_up = storage_verdicts([0, 1], {}, {}, ZkView(frozenset({0, 1}), frozenset({0, 1})))
    assert all(v.serving for v in caught_up.values())


def test_a_partition_held_here_but_not_assigned_in_zookeeper_counts_as_before():
    """Being retired (unassigned in ZooKeeper, files still here): no session counts it, and it needs none."""
    verdicts = storage_verdicts([0, 3], {}, {}, ZkView(frozenset({0}), frozenset({0})))
    assert verdicts[partition_name(3)].serving and verdicts[""].serving
