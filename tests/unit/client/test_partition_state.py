"""ClientPartitionState: ReqIds, mount transitions, generation moves and the apply gate."""

import pytest

from waltz_client.partition_state import ClientPartitionState, FeedDecision, MountResult, MountState
from waltz_common.types import INT32_MAX, INT32_MIN, ReqId


def mounted(generation: int = 0) -> ClientPartitionState:
    state = ClientPartitionState(client_id=3, partition_id=2, generation=generation)
    assert state.on_mount_response(state.begin_mount(), MountResult.READY)
    return state


def test_req_ids_count_up_and_wrap() -> None:
    state = ClientPartitionState(client_id=3, partition_id=2, generation=1, last_seq_num=INT32_MAX - 1)
    assert state.next_req_id() == ReqId(3, 1, 2, INT32_MAX)
    assert state.next_req_id() == ReqId(3, 1, 2, INT32_MIN)
    assert state.next_req_id().seq_num == INT32_MIN + 1


def test_sequence_numbers_taken_together_count_up_and_wrap_as_one_by_one() -> None:
    state = ClientPartitionState(client_id=3, partition_id=2, last_seq_num=INT32_MAX - 5)
    assert list(state.next_seq_nums(3)) == [INT32_MAX - 4, INT32_MAX - 3, INT32_MAX - 2]
    assert list(state.next_seq_nums(4)) == [INT32_MAX - 1, INT32_MAX, INT32_MIN, INT32_MIN + 1]
    assert list(state.next_seq_nums(0)) == [] and state.next_seq_num() == INT32_MIN + 2


@pytest.mark.parametrize("field", ["client_id", "partition_id", "generation", "last_seq_num"])
def test_fields_must_be_int32(field: str) -> None:
    args = {"client_id": 0, "partition_id": 0, field: INT32_MAX + 1}
    with pytest.raises(ValueError):
        ClientPartitionState(**args)


def test_mount_ready_allows_appends() -> None:
    state = ClientPartitionState(client_id=3, partition_id=2)
    assert not state.appends_allowed
    req = state.begin_mount()
    assert state.mount_state is MountState.MOUNTING and not state.appends_allowed
    assert state.on_mount_response(req, MountResult.READY)
    assert state.mount_state is MountState.MOUNTED and state.appends_allowed
    with pytest.raises(RuntimeError):
        state.begin_mount()


def test_stale_mount_response_is_ignored() -> None:
    state = ClientPartitionState(client_id=3, partition_id=2)
    old = state.begin_mount()
    state.on_disconnect()
    new = state.begin_mount()
    assert not state.on_mount_response(old, MountResult.READY)
    assert state.mount_state is MountState.MOUNTING
    assert state.on_mount_response(new, MountResult.READY)
    assert not state.on_mount_response(old, MountResult.NOT_READY)
    assert not state.on_mount_response(new, MountResult.CLIENT_AHEAD)  # answered already
    assert state.mount_state is MountState.MOUNTED


def test_not_ready_then_retry() -> None:
    state = ClientPartitionState(client_id=3, partition_id=2)
    assert state.on_mount_response(state.begin_mount(), MountResult.NOT_READY)
    assert state.mount_state is MountState.UNMOUNTED
    assert state.on_mount_response(state.begin_mount(), MountResult.READY)


def test_client_ahead_is_sticky_until_mounted_again() -> None:
    state = ClientPartitionState(client_id=3, partition_id=2)
    assert state.on_mount_response(state.begin_mount(), MountResult.CLIENT_AHEAD)
    state.on_disconnect()
    assert state.mount_state is MountState.CLIENT_AHEAD and not state.appends_allowed
    assert state.on_mount_response(state.begin_mount(), MountResult.READY)


def test_permission_denied_is_sticky_like_client_ahead() -> None:
    state = ClientPartitionState(client_id=3, partition_id=2)
    assert state.on_mount_response(state.begin_mount(), MountResult.PERMISSION_DENIED)
    state.on_disconnect()
    assert state.mount_state is MountState.PERMISSION_DENIED and not state.appends_allowed


def test_newer_generation_forces_remount_and_keeps_sequence() -> None:
    state = mounted(generation=4)
    before = state.next_req_id()
    assert not state.update_generation(4)
    assert not state.update_generation(3)
    assert state.mount_state is MountState.MOUNTED
    assert state.update_generation(5)
    assert state.mount_state is MountState.UNMOUNTED and state.generation == 5
    after = state.next_req_id()
    assert after.generation == 5 and after.seq_num == before.seq_num + 1


def test_apply_gate() -> None:
    state = mounted()
    assert state.accept_feed(10, client_high_water_mark=9) is FeedDecision.APPLY
    assert state.accept_feed(0, client_high_water_mark=-1) is FeedDecision.APPLY
    assert state.accept_feed(9, client_high_water_mark=9) is FeedDecision.SKIP_DUPLICATE
    assert state.accept_feed(3, client_high_water_mark=9) is FeedDecision.SKIP_DUPLICATE
    assert state.mount_state is MountState.MOUNTED
    assert state.accept_feed(11, client_high_water_mark=9) is FeedDecision.GAP
    assert state.mount_state is MountState.UNMOUNTED


def test_not_ready_for_the_mount_answered_ready_ends_it() -> None:
    """The server closed the partition and ended the feed that mount started: mount again."""
    s = ClientPartitionState(1, 0)
    first = s.begin_mount()
    assert s.on_mount_response(first, MountResult.READY)
    assert not s.on_mount_response(ReqId(1, 0, 0, 0), MountResult.NOT_READY)  # made before this mount
    assert not s.on_mount_response(first, MountResult.READY)  # a repeat changes nothing
    assert s.mount_state is MountState.MOUNTED
    assert s.on_mount_response(first, MountResult.NOT_READY)
    assert s.mount_state is MountState.UNMOUNTED and not s.appends_allowed
    second = s.begin_mount()
    assert not s.on_mount_response(first, MountResult.NOT_READY)  # the old mount's end, late: stale
    assert s.on_mount_response(second, MountResult.READY) and s.mount_state is MountState.MOUNTED
    s.on_disconnect()
    second_again = s.begin_mount()
    assert not s.on_mount_response(second, MountResult.NOT_READY)  # ended by the disconnect already
    assert s.mount_state is MountState.MOUNTING and second_again != second


def test_not_ready_for_a_flush_under_the_mount_unmounts() -> None:
    """The server refuses a flush it cannot vouch for (the partition there is not the one mounted) with an
    unasked NOT_READY for the flush's ReqId, made after the mount: mount again."""
    state = ClientPartitionState(client_id=3, partition_id=2, generation=4)
    mount = state.begin_mount()
    assert state.on_mount_response(mount, MountResult.READY)
    flushed = state.next_req_id()  # a pending append's ReqId, which a flush carries
    assert state.on_mount_response(flushed, MountResult.NOT_READY)
    assert state.mount_state is MountState.UNMOUNTED and not state.appends_allowed


def test_not_ready_for_a_request_of_another_generation_keeps_the_mount() -> None:
    state = ClientPartitionState(client_id=3, partition_id=2, generation=4)
    stale = state.next_req_id()
    state.update_generation(5)
    assert state.on_mount_response(state.begin_mount(), MountResult.READY)
    assert not state.on_mount_response(stale, MountResult.NOT_READY)
    assert state.mount_state is MountState.MOUNTED
