"""The rules of ReqIds on a partition: strictly increasing sequence numbers, re-sent appends answered with their
original transaction (also by a new owner, from the log's tail), superseded streams and stale mounts answered."""

from __future__ import annotations

from dataclasses import replace

from waltz.v1 import server_pb2
from waltz_common.types import Record, ReqId, crc32

from .fakes import FakeStore, FakeStream
from .harness import SMALL, mounted_client, opened, run
from .helpers import append, mount

Reason = server_pb2.AppendRejected.Reason
State = server_pb2.MountResponse


def test_sequence_numbers_that_do_not_increase_are_rejected_with_a_reason():
    async def scenario():
        partition, _, stream = await mounted_client()
        await partition.submit(stream, [append(seq=1000)])
        await stream.wait_for(lambda s: len(s.fed()) == 1)
        await partition.submit(stream, [append(seq=7), append(seq=-5), append(seq=1001)])
        await stream.wait_for(lambda s: len(s.fed()) == 2 and len(s.of("append_rejected")) == 2)
        rejections = stream.of("append_rejected")
        assert [(r.req_id.seq_num, r.reason) for r in rejections] == [
            (7, Reason.SEQUENCE_NOT_INCREASING), (-5, Reason.SEQUENCE_NOT_INCREASING)
        ]
        assert "not after 1000" in rejections[0].message and rejections[0].transaction_id == -1
        assert stream.fed() == [(0, 1000), (1, 1001)]
        await partition.close()

    run(scenario)


def test_a_resent_committed_append_is_answered_with_its_transaction_and_not_committed_again():
    async def scenario():
        partition, _, stream = await mounted_client()
        await partition.submit(stream, [append(seq=1, data=b"a"), append(seq=2, data=b"b")])
        await stream.wait_for(lambda s: len(s.fed()) == 2)
        await partition.submit(stream, [append(seq=1, data=b"a"), append(seq=3), append(seq=3)])  # 2nd 3: pending
        await stream.wait_for(lambda s: len(s.of("append_rejected")) == 2)
        answers = [(r.req_id.seq_num, r.reason, r.transaction_id) for r in stream.of("append_rejected")]
        assert answers == [(1, Reason.ALREADY_COMMITTED, 0), (3, Reason.ALREADY_COMMITTED, 2)]
        assert stream.fed() == [(0, 1), (1, 2), (2, 3)]
        assert partition.high_water_mark == 2
        await partition.close()

    run(scenario)


def _earlier_owner_log(count: int) -> list[Record]:
    """count transactions client 1 appended under generation 1 (seq i + 1), then one of client 2."""
    records = [Record(i, ReqId(1, 1, 0, i + 1), 0, b"r%d" % i, crc32(b"r%d" % i)) for i in range(count)]
    return [*records, Record(count, ReqId(2, 1, 0, 50), 0, b"z", crc32(b"z"))]


def test_a_new_owner_answers_resends_from_the_logs_tail_within_the_window():
    async def scenario():
        store = FakeStore(0, _earlier_owner_log(30))
        partition, _ = await opened(store, replace(SMALL, resend_window=10, feed_fetch_size=4), generation=2)
        assert store.header_reads[0] == (21, 4)  # only the window's tail was read, in fetch-sized pieces
        stream = FakeStream()
        partition.mount(stream, mount(seq=100, hwm=30, generation=2))
        await stream.wait_for(lambda s: s.of("mount"))
        resent_old_generation = append(seq=25, data=b"r24", generation=1)
        resent_new_generation = append(seq=30, data=b"r29", generation=2)
        too_old = append(seq=3, data=b"r2", generation=2)  # out of the window, below the client's last number
        new = append(seq=31, generation=2)
        await partition.submit(stream, [resent_old_generation, resent_new_generation, too_old, new])
        await stream.wait_for(lambda s: len(s.fed()) == 1 and len(s.of("append_rejected")) == 3)
        answers = [(r.req_id.seq_num, r.reason, r.transaction_id) for r in stream.of("append_rejected")]
        assert answers == [
            (25, Reason.ALREADY_COMMITTED, 24),
            (30, Reason.ALREADY_COMMITTED, 29),
            (3, Reason.SEQUENCE_NOT_INCREASING, -1),
        ]
        assert stream.fed() == [(31, 31)] and partition.high_water_mark == 31
        await partition.close()

    run(scenario)


def test_a_superseded_streams_appends_and_a_stale_mount_are_answered():
    async def scenario():
        partition, _, old = await mounted_client()
        new = FakeStream()
        partition.mount(new, mount(seq=2, net_seq=2))
        await new.wait_for(lambda s: s.of("mount"))
        [lost] = old.of("mount")[1:]  # unasked, for the mount the old stream lost
        assert lost.state == State.SUPERSEDED and lost.req_id.seq_num == 0 and "newer stream" in lost.message
        await partition.submit(old, [append(seq=3)])
        [refused] = old.of("append_rejected")
        assert refused.reason == Reason.SUPERSEDED and "newer stream of client 1" in refused.message
        partition.mount(old, mount(seq=4, net_seq=1))  # a stale network client mounts again
        assert old.of("mount")[-1].state == State.SUPERSEDED and old.of("mount")[-1].req_id.seq_num == 4
        await partition.submit(new, [append(seq=5)])
        await new.wait_for(lambda s: s.fed() == [(0, 5)])
        await partition.close()

    run(scenario)
