"""The storage node's trust rules (issue 25): who may write, and how low a truncation may go."""

from __future__ import annotations

import pytest

from waltz_storage import rules
from waltz_storage.errors import CommittedDataError, PermissionDenied

SERVER = rules.Caller.from_roles(["server"])
OPERATOR = rules.Caller.from_roles(["operator"])
NOBODY = rules.Caller.from_roles(["application"])


@pytest.mark.parametrize("kind", sorted(rules.WRITES))
def test_online_writes_need_the_server_role(kind):
    rules.admit_caller(SERVER, kind, offline=False, partition_id=0)
    rules.admit_caller(rules.PLAINTEXT, kind, offline=False, partition_id=0)  # the cluster key is the credential
    with pytest.raises(PermissionDenied, match=rf"partition 0: {kind} is an online write.*role operator"):
        rules.admit_caller(OPERATOR, kind, offline=False, partition_id=0)
    rules.admit_caller(OPERATOR, kind, offline=True, partition_id=0)  # offline: the partition's flag decides


@pytest.mark.parametrize("kind", ["max_transaction_id", "last_session_info", "record_list", "record"])
def test_reads_are_for_servers_and_operators(kind):
    rules.admit_caller(SERVER, kind, offline=False, partition_id=1)
    rules.admit_caller(OPERATOR, kind, offline=False, partition_id=1)
    with pytest.raises(PermissionDenied, match="role application may not send"):
        rules.admit_caller(NOBODY, kind, offline=False, partition_id=1)


def test_the_truncation_floor_is_the_higher_of_the_low_water_mark_and_what_a_session_said_is_committed():
    assert rules.truncation_floor(100, 40, 902, offline=False) == 902
    assert rules.truncation_floor(903, 40, -1, offline=False) == 903
    assert rules.truncation_floor(903, 40, 902, offline=True) == 40  # recover-partition: its own valid prefix


def test_truncate_below_the_floor_is_refused_and_a_no_op_is_not():
    with pytest.raises(CommittedDataError, match="refusing to truncate to 100: transactions up to 903"):
        rules.check_truncate(0, 100, 903, 903)
    with pytest.raises(CommittedDataError):
        rules.check_truncate(0, -1, 903, 903)
    rules.check_truncate(0, 903, 905, 903)  # the uncommitted tail goes
    rules.check_truncate(0, 5, 5, 903)  # nothing above 5 to remove: a no-op, whatever the floor


def test_the_low_water_mark_never_goes_down():
    rules.check_low_water_mark(0, 903, 903, 903)
    rules.check_low_water_mark(0, 904, 903, 903)
    with pytest.raises(CommittedDataError, match=r"refusing low-water mark 100: .* already 903"):
        rules.check_low_water_mark(0, 100, 903, 903)
    with pytest.raises(CommittedDataError, match=r"refusing low-water mark 900: .* never goes below 903"):
        rules.check_low_water_mark(0, 900, 903, 1000)


def test_a_low_water_mark_the_replica_never_reached_comes_down_to_what_it_holds_never_below():
    """Issue 44: a previous-release server sets the mark above what the replica holds (it copies the replica up
    after), so the node takes it. Issue 33: a mark the replica never reached (SetLowWaterMark(10^6) on a replica
    holding 49) refused every later session's mark for ever; now the next one may bring it down to the max."""
    rules.check_low_water_mark(0, 10**6, 49, 49)  # above the max: taken
    rules.check_low_water_mark(0, 49, 10**6, 49)
    rules.check_low_water_mark(0, 60, 10**6, 49)
    with pytest.raises(CommittedDataError, match=r"refusing low-water mark 48: .* never goes below 49"):
        rules.check_low_water_mark(0, 48, 10**6, 49)
