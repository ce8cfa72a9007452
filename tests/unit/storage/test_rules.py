"""The storage node's trust rules (issue 25): who may write, and how low a truncation may go."""

from __future__ import annotations

import pytest

from waltz_storage import rules
from waltz_storage.errors import CommittedDataError, InvalidRequest, PermissionDenied

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
    rules.check_low_water_mark(0, 903, 903)
    rules.check_low_water_mark(0, 904, 903)
    with pytest.raises(CommittedDataError, match=r"refusing low-water mark 100: .* already 903"):
        rules.check_low_water_mark(0, 100, 903)


def test_the_low_water_mark_never_goes_above_what_the_replica_holds():
    """Issue 33: SetLowWaterMark(10^6) on a replica holding 49 was accepted, and every later session's recovery
    of that replica was refused ("the partition's low-water mark is already 1000000")."""
    rules.check_low_water_mark_held(0, 49, 49)
    rules.check_low_water_mark_held(0, -1, -1)
    with pytest.raises(InvalidRequest, match=r"refusing low-water mark 1000000: .* only up to 49"):
        rules.check_low_water_mark_held(0, 10**6, 49)
