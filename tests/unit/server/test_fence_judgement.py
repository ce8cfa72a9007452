"""FenceJudgement and damage_restart (waltz_server.fence_judgement): a replica's fence refusal is a poisoned fence
only when ZooKeeper says this session is still the partition's newest; a damage poll's answer ends the session."""

from __future__ import annotations

from waltz_server.fence_judgement import DAMAGE_SHOWN, Fenced, FenceJudgement, LeftOut, damage_restart
from waltz_server.recovery import SessionFencedError
from waltz_server.store.connection import Code, StorageRpcError
from waltz_server.store.metadata import MetadataConflict
from waltz_server.store.session_end import refused_by_replica

R = "127.0.0.1:5001"
REFUSAL = "STALE_SESSION: session 7 is below the fence 1000000000000"


def test_only_a_replica_refusing_for_its_fence_is_judged_and_only_with_zookeeper_to_ask() -> None:
    judgement = FenceJudgement(7, can_ask_zookeeper=True)
    assert judgement.asks_zookeeper(refused_by_replica(StorageRpcError(Code.STALE_SESSION, "below the fence")))
    assert judgement.asks_zookeeper(refused_by_replica(SessionFencedError("replica holds session 9")))
    assert not judgement.asks_zookeeper(refused_by_replica(StorageRpcError(Code.UNKNOWN_PARTITION, "not here")))
    assert not judgement.asks_zookeeper(refused_by_replica(MetadataConflict("another session took over")))
    assert not judgement.asks_zookeeper(refused_by_replica(OSError("connection reset")))
    assert not FenceJudgement(7, can_ask_zookeeper=False).asks_zookeeper(True)


def test_a_newer_session_in_zookeeper_or_no_answer_from_it_leaves_the_refusal_standing() -> None:
    judgement = FenceJudgement(7, can_ask_zookeeper=True)
    assert judgement.judge(R, REFUSAL, newest=False, in_write_set=False) == Fenced()
    assert judgement.judge(R, REFUSAL, newest=None, in_write_set=True) == Fenced()
    assert judgement.poisoned == set()


def test_a_poisoned_fence_leaves_the_replica_out_and_says_so_once() -> None:
    judgement = FenceJudgement(7, can_ask_zookeeper=True)
    first = judgement.judge(R, REFUSAL, newest=True, in_write_set=False)
    assert isinstance(first, LeftOut) and first.first and first.ends_session is None
    assert first.detail == (
        f"left out: its fence is above session 7, the partition's newest ({REFUSAL}); "
        "clear it with `waltz storage reset-fence`"
    )
    again = judgement.judge(R, REFUSAL, newest=True, in_write_set=False)
    assert again == LeftOut(first.detail, first=False, ends_session=None)
    assert judgement.poisoned == {R}


def test_a_poisoned_member_of_the_write_set_ends_the_session_so_the_next_leaves_it_out() -> None:
    verdict = FenceJudgement(7, can_ask_zookeeper=True).judge(R, REFUSAL, newest=True, in_write_set=True)
    assert isinstance(verdict, LeftOut)
    assert verdict.ends_session == f"replica {R}: {REFUSAL}; the next session leaves it out"


def test_damage_reported_by_a_member_restarts_the_session_naming_the_first_ids() -> None:
    assert damage_restart(R, []) is None
    assert damage_restart(R, [100, 500]) == f"replica {R} holds 2 damaged transactions (100, 500)"
    many = list(range(10, 10 + DAMAGE_SHOWN + 2))
    shown = ", ".join(map(str, many[:DAMAGE_SHOWN]))
    assert damage_restart(R, many) == f"replica {R} holds {len(many)} damaged transactions ({shown}, ...)"
