"""TransactionMonitor: success and failure inference from feed, mount, flush, lock failure, rejection."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from waltz_client.monitor import (
    CLEARED,
    FLUSHED,
    SUPERSEDED,
    CapacityError,
    Outcome,
    OutcomeKind,
    TransactionMonitor,
)
from waltz_common.types import INT32_MAX, INT32_MIN, ReqId
from waltz_common.wire import req_id_to_proto

ME = 1
OTHER = 2


def rid(seq: int, client: int = ME) -> ReqId:
    return ReqId(client, 0, 0, seq)


def monitor_with(*seqs: int, hwm: int = -1, capacity: int = 5) -> TransactionMonitor[str]:
    monitor = TransactionMonitor[str](max_concurrent=capacity, client_high_water_mark=hwm)
    for seq in seqs:
        monitor.register(rid(seq), f"t{seq}", now=float(seq))
    return monitor


def failed(token: str, reason: str) -> tuple[str, Outcome]:
    return token, Outcome.failed(reason)


def test_own_append_in_feed_commits() -> None:
    monitor = monitor_with(1)
    assert monitor.on_feed(rid(1), 7) == [("t1", Outcome.committed(7))]
    assert monitor.pending_count() == 0
    assert monitor.on_feed(rid(1), 7) == []


def test_dropped_append_fails_when_a_later_own_append_is_fed() -> None:
    monitor = monitor_with(1, 2, 3)
    assert monitor.on_feed(rid(2), 10) == [failed("t1", SUPERSEDED), ("t2", Outcome.committed(10))]
    assert monitor.pending_count() == 1  # t3 was registered after t2: still undecided


def test_interleaving_with_other_clients() -> None:
    monitor = monitor_with(1, 2, 3)
    resolved = []
    for req, txn in [(rid(9, OTHER), 0), (rid(1), 1), (rid(5, OTHER), 2), (rid(3), 3), (rid(2), 4)]:
        resolved += monitor.on_feed(req, txn)
    assert resolved == [("t1", Outcome.committed(1)), failed("t2", SUPERSEDED), ("t3", Outcome.committed(3))]


def test_feed_entries_are_matched_on_every_req_id_field_also_as_protobuf_messages() -> None:
    monitor = monitor_with(1, 2)
    assert monitor.on_feed(ReqId(ME, 1, 0, 9), 5) == []  # another sequence number
    # the generation does not matter: sequence numbers never repeat (an append sent again after a remount may
    # carry a newer generation)
    for stranger in (rid(1, OTHER), ReqId(ME, 0, 3, 1)):  # same sequence number only
        assert monitor.on_feed(stranger, 5) == []
        assert monitor.on_feed(req_id_to_proto(stranger), 5) == []
    assert monitor.on_lock_failure(rid(2, OTHER), 5) == [] and monitor.on_rejected(ReqId(ME, 1, 3, 2), "x") == []
    assert monitor.pending_count() == 2
    assert monitor.on_feed(req_id_to_proto(rid(2)), 6) == [failed("t1", SUPERSEDED), ("t2", Outcome.committed(6))]


def test_commit_oldest_is_on_feed_for_the_oldest_pending_append_and_changes_nothing_otherwise() -> None:
    monitor = monitor_with(1, 2, 3)
    for not_oldest in (rid(2), rid(9)):  # the caller matched the client and partition
        assert monitor.commit_oldest(not_oldest.seq_num) is None
    assert monitor.pending_count() == 3
    assert monitor.commit_oldest(1) == "t1"
    assert monitor.commit_oldest(1) is None and monitor.pending_count() == 2
    assert monitor.on_feed(rid(3), 8) == [failed("t2", SUPERSEDED), ("t3", Outcome.committed(8))]
    assert monitor.commit_oldest(4) is None  # empty


def test_a_remount_fails_nothing_its_pending_appends_are_sent_again() -> None:
    """Issue 24's rule: a remount proves nothing about what was pending; the same sequence numbers go again and the
    server's answer decides."""
    monitor = monitor_with(1, 2, 3, 4)
    assert monitor.on_feed(rid(1), 0) == [("t1", Outcome.committed(0))]  # catch-up feed
    assert monitor.on_lock_failure(rid(4), 7) == [("t4", Outcome.lock_failed(7))]
    assert monitor.take_resends(now=5.0) == ["t2", "t3"]  # not the lock-failed one: it waits for its conflict
    assert monitor.on_mount_complete() == []
    assert monitor.pending_count() == 3 and monitor.oldest_pending_age(6.0) == 1.0
    # a rejection of a re-send that proves nothing leaves it pending; SEQUENCE_NOT_INCREASING is final
    assert monitor.on_rejected(rid(2), "PARTITION_NOT_READY") == []
    assert monitor.on_rejected(rid(2), "SEQUENCE_NOT_INCREASING") == [
        failed("t2", "rejected: SEQUENCE_NOT_INCREASING")
    ]
    # ALREADY_COMMITTED: the feed brings it (after the client's mark) or it is committed (at or before the mark)
    assert monitor.on_rejected(rid(3), "ALREADY_COMMITTED", 9) == []
    assert monitor.on_client_high_water_mark(6) == []
    assert monitor.on_rejected(rid(3), "ALREADY_COMMITTED", 6) == [("t3", Outcome.committed(6))]


def test_a_first_send_rejected_fails_at_once() -> None:
    monitor = monitor_with(1)
    assert monitor.on_rejected(rid(1), "PARTITION_NOT_READY") == [failed("t1", "rejected: PARTITION_NOT_READY")]


def test_flush_fails_unfed_appends_once_client_catches_up() -> None:
    monitor = monitor_with(1, 2, 3, hwm=3)
    assert monitor.on_flush_response(rid(2), high_water_mark=5, client_high_water_mark=3) == []
    assert monitor.on_client_high_water_mark(4) == []
    assert monitor.on_feed(rid(1), 5) == [("t1", Outcome.committed(5))]
    assert monitor.on_flush_response(rid(2), 5, 4) == []  # the shell may repeat it
    assert monitor.on_client_high_water_mark(5) == [failed("t2", FLUSHED)]
    assert monitor.pending_count() == 1  # t3 came after the flush target
    assert monitor.on_client_high_water_mark(6) == []


def test_flush_already_caught_up_resolves_at_once() -> None:
    monitor = monitor_with(1, 2, hwm=8)
    assert monitor.on_flush_response(rid(2), 8, 8) == [failed("t1", FLUSHED), failed("t2", FLUSHED)]


def test_flush_target_resolved_meanwhile_still_covers_older_entries() -> None:
    monitor = monitor_with(1, 2, hwm=0)
    assert monitor.on_rejected(rid(2), "wrong generation") == [failed("t2", "rejected: wrong generation")]
    assert monitor.on_flush_response(rid(2), 1, 0) == []
    assert monitor.on_client_high_water_mark(1) == [failed("t1", FLUSHED)]


def test_flush_order_follows_sequence_wrap_around() -> None:
    monitor = TransactionMonitor[str]()
    monitor.register(rid(INT32_MAX), "before", now=0.0)
    monitor.register(rid(INT32_MIN), "after", now=0.0)
    assert monitor.on_flush_response(rid(INT32_MAX), -1, -1) == [failed("before", FLUSHED)]


def test_flush_ignores_other_clients_req_ids() -> None:
    monitor = monitor_with(1)
    assert monitor.on_flush_response(rid(5, OTHER), -1, -1) == []


def test_lock_failure_is_noticed_at_once_and_aborted_after_catching_up() -> None:
    monitor = monitor_with(1, 2, hwm=5)
    assert monitor.on_lock_failure(rid(1), 7) == [("t1", Outcome.lock_failed(7))]
    assert monitor.on_lock_failure(rid(1), 7) == []
    assert monitor.pending_count() == 2  # still holds capacity
    assert monitor.on_feed(rid(2), 6) == [("t2", Outcome.committed(6))]  # does not fail t1
    assert monitor.on_client_high_water_mark(6) == []
    [(token, outcome)] = monitor.on_client_high_water_mark(7)
    assert token == "t1" and outcome.kind is OutcomeKind.FAILED and "7" in outcome.reason


def test_lock_failure_already_caught_up_aborts_at_once() -> None:
    monitor = monitor_with(1, hwm=9)
    notice, (token, outcome) = monitor.on_lock_failure(rid(1), 4)
    assert notice == ("t1", Outcome.lock_failed(4)) and not notice[1].is_final
    assert token == "t1" and outcome.kind is OutcomeKind.FAILED and outcome.is_final


def test_lock_failed_entry_survives_remount_until_hwm() -> None:
    monitor = monitor_with(1, 2, hwm=2)
    monitor.on_lock_failure(rid(1), 3)
    assert monitor.take_resends(now=10.0) == ["t2"] and monitor.on_mount_complete() == []
    assert monitor.on_feed(rid(2), 3) == [("t2", Outcome.committed(3))]  # the re-send committed
    assert monitor.oldest_pending_age(10.0) is None and monitor.flush_target() is None
    assert [t for t, _ in monitor.on_client_high_water_mark(3)] == ["t1"]


def test_capacity_bound() -> None:
    monitor = monitor_with(1, 2, capacity=2)
    assert not monitor.has_capacity()
    with pytest.raises(CapacityError):
        monitor.register(rid(3), "t3", now=0.0)
    monitor.on_rejected(rid(1), "x")
    assert monitor.has_capacity()
    monitor.register(rid(3), "t3", now=0.0)
    assert TransactionMonitor[str]().max_concurrent == 5
    with pytest.raises(ValueError):
        TransactionMonitor[str](max_concurrent=0)


def test_tokens_that_are_their_own_req_ids_register_together_all_or_none_for_capacity() -> None:
    monitor: TransactionMonitor[ReqId] = TransactionMonitor(3)
    monitor.register_all([rid(1), rid(2)], now=1.0)
    with pytest.raises(CapacityError):
        monitor.register_all([rid(3), rid(4)], now=2.0)
    assert monitor.pending_count() == 2
    with pytest.raises(ValueError, match="already registered"):
        monitor.register_all([rid(2)], now=2.0)
    monitor.register_all([rid(3)], now=2.0)
    assert monitor.oldest_pending_age(5.0) == 4.0 and monitor.flush_target() == rid(3)
    assert monitor.on_feed(req_id_to_proto(rid(2)), 7) == [(rid(1), Outcome.failed(SUPERSEDED)),
                                                           (rid(2), Outcome.committed(7))]


def test_duplicate_registration_is_refused() -> None:
    monitor = monitor_with(1)
    with pytest.raises(ValueError):
        monitor.register(rid(1), "again", now=0.0)


def test_rejected_fails_at_once() -> None:
    monitor = monitor_with(1, 2)
    assert monitor.on_rejected(rid(2), "wrong generation") == [failed("t2", "rejected: wrong generation")]
    assert monitor.on_rejected(rid(2), "again") == []
    assert monitor.pending_count() == 1


def test_age_and_flush_target() -> None:
    monitor = monitor_with(1, 2, 3)
    assert monitor.oldest_pending_age(10.0) == 9.0
    assert monitor.flush_target() == rid(3)
    monitor.on_lock_failure(rid(3), 100)
    monitor.on_rejected(rid(1), "x")
    assert monitor.oldest_pending_age(10.0) == 8.0
    assert monitor.flush_target() == rid(2)
    assert TransactionMonitor[str]().oldest_pending_age(1.0) is None


def test_clear_fails_everything() -> None:
    monitor = monitor_with(1, 2)
    monitor.on_lock_failure(rid(2), 50)
    assert monitor.clear() == [failed("t1", CLEARED), failed("t2", CLEARED)]
    assert monitor.pending_count() == 0


EVENTS = st.lists(
    st.tuples(st.sampled_from("rfomlhxc"), st.integers(0, 7), st.integers(-1, 3)), max_size=40
)


@settings(max_examples=300, deadline=None)
@given(events=EVENTS)
def test_every_entry_is_resolved_exactly_once(events: list[tuple[str, int, int]]) -> None:
    monitor = TransactionMonitor[int](max_concurrent=3)
    registered: list[ReqId] = []
    notices: dict[int, int] = {}
    finals: dict[int, int] = {}
    hwm, next_txn = -1, 0

    def record(resolved: list[tuple[int, Outcome]]) -> None:
        for token, outcome in resolved:
            assert token not in finals, "resolved after its final outcome"
            if outcome.is_final:
                finals[token] = finals.get(token, 0) + 1
            else:
                notices[token] = notices.get(token, 0) + 1

    for kind, i, d in events:
        target = registered[i % len(registered)] if registered else rid(0)
        if kind == "r" and monitor.has_capacity():
            registered.append(rid(len(registered)))
            monitor.register(registered[-1], len(registered) - 1, now=0.0)
        elif kind == "f":
            record(monitor.on_feed(target if d >= 0 else rid(i, OTHER), next_txn))
            next_txn += 1
        elif kind == "o":
            monitor.take_resends(now=0.0)
            record(monitor.on_mount_complete())
        elif kind == "m":
            record(monitor.on_flush_response(target, hwm + d, hwm))
        elif kind == "l":
            record(monitor.on_lock_failure(target, hwm + d))
        elif kind == "h":
            hwm += max(d, 0)
            record(monitor.on_client_high_water_mark(hwm))
        elif kind == "x":
            record(monitor.on_rejected(target, ("refused", "SEQUENCE_NOT_INCREASING", "ALREADY_COMMITTED")[i % 3], hwm))
        elif kind == "c":
            record(monitor.clear())
        assert monitor.pending_count() == len(registered) - len(finals)
    record(monitor.clear())
    assert finals == dict.fromkeys(range(len(registered)), 1)
    assert all(count == 1 for count in notices.values())
