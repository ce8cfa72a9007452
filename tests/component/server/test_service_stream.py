"""The Stream RPC over a real grpc.aio channel: mount, batched appends and feeds, flush, bad input."""

from __future__ import annotations

from waltz.v1 import server_pb2

from .grpc_harness import served
from .harness import run
from .helpers import append, mount, req

Reason = server_pb2.AppendRejected.Reason
State = server_pb2.MountResponse


def test_mount_append_feed_and_flush_over_one_stream_for_two_partitions():
    async def scenario():
        async with served() as s:
            stream = s.open_stream()
            await stream.send(mount=mount(partition_id=0))
            await stream.send(mount=mount(partition_id=1))
            await stream.receive_until(lambda h: len(h.of("mount")) == 2)
            assert {m.req_id.partition_id for m in stream.of("mount")} == {0, 1}
            assert all(m.state == State.READY for m in stream.of("mount"))
            batch = [append(seq=i, partition_id=i % 2) for i in range(1, 201)]
            await stream.send(appends=server_pb2.AppendBatch(requests=batch))
            await stream.send(flush=server_pb2.FlushRequest(req_id=req(seq=200, partition_id=0)))
            await stream.receive_until(lambda h: len(h.fed()) == 200 and h.of("flush"))
            by_partition: dict[int, list[int]] = {0: [], 1: []}
            for b in stream.of("feed"):
                for f in b.transactions:
                    by_partition[f.req_id.partition_id].append(f.transaction_id)
            assert by_partition == {0: list(range(100)), 1: list(range(100))}
            assert len(stream.of("feed")) < 50  # batched
            assert stream.of("flush")[0].transaction_id == 99
            await stream.call.done_writing()

    run(scenario)


def test_bad_input_gets_precise_answers_and_the_server_keeps_serving():
    async def scenario():
        async with served() as s:
            stream = s.open_stream()
            await stream.send(mount=mount(partition_id=0))
            await stream.receive_until(lambda h: h.of("mount"))
            bad = append(seq=1)
            bad.checksum ^= 1
            elsewhere = append(seq=1, partition_id=2)
            nowhere = append(seq=1, partition_id=9)
            await stream.send(appends=server_pb2.AppendBatch(requests=[bad, elsewhere, nowhere, append(seq=2)]))
            await stream.receive_until(lambda h: len(h.of("append_rejected")) == 3 and h.fed())
            reasons = {r.req_id.partition_id: (r.reason, r.message) for r in stream.of("append_rejected")}
            assert reasons[0][0] == Reason.INVALID and "checksum" in reasons[0][1]
            assert (
                reasons[2][0] == Reason.PARTITION_NOT_READY and "partition 2 is not owned by server 7" in reasons[2][1]
            )
            assert reasons[9][0] == Reason.INVALID and "partition 9 does not exist" in reasons[9][1]
            assert stream.fed() == [(0, 2)]

            not_here = s.open_stream()
            await not_here.send(mount=mount(partition_id=3))
            await not_here.receive_until(lambda h: h.of("mount"))
            assert not_here.of("mount")[0].state == State.NOT_READY

            # a bad partition id in a mount, feed or flush is answered for that request; the stream goes on
            await stream.send(mount=mount(partition_id=12, seq=10))
            await stream.send(feed=server_pb2.FeedRequest(req_id=req(seq=11, partition_id=-1)))
            await stream.send(flush=server_pb2.FlushRequest(req_id=req(seq=12, partition_id=99)))
            await stream.receive_until(lambda h: len(h.of("mount")) == 4)
            refused = stream.of("mount")[1:]
            assert [(m.req_id.partition_id, m.state) for m in refused] == [
                (12, State.NO_SUCH_PARTITION), (-1, State.NO_SUCH_PARTITION), (99, State.NO_SUCH_PARTITION)
            ]
            assert "partition 12 does not exist" in refused[0].message

            await stream.send(appends=server_pb2.AppendBatch(requests=[append(seq=3)]))  # still serving
            await stream.receive_until(lambda h: len(h.fed()) == 2)

    run(scenario)


def test_a_second_stream_of_the_client_takes_over_the_partition():
    async def scenario():
        async with served() as s:
            old = s.open_stream()
            await old.send(mount=mount(net_seq=1))
            await old.receive_until(lambda h: h.of("mount"))
            new = s.open_stream()
            await new.send(mount=mount(seq=2, net_seq=2))
            await new.receive_until(lambda h: h.of("mount"))
            await old.send(appends=server_pb2.AppendBatch(requests=[append(seq=3)]))
            await new.send(appends=server_pb2.AppendBatch(requests=[append(seq=4)]))
            await new.receive_until(lambda h: h.fed())
            assert new.fed() == [(0, 4)]
            assert s.manager.get(0).high_water_mark == 0

    run(scenario)


def test_closing_a_stream_frees_its_mounts():
    async def scenario():
        async with served() as s:
            stream = s.open_stream()
            await stream.send(mount=mount())
            await stream.receive_until(lambda h: h.of("mount"))
            stream.call.cancel()
            for _ in range(200):
                if not len(s.manager.get(0).feeds):
                    break
                import asyncio

                await asyncio.sleep(0.01)
            assert not len(s.manager.get(0).feeds) and len(s.manager.get(0)._mounts) == 0

    run(scenario)
