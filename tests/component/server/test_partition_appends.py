"""Partition append path over an in-memory store: dense ids, batching, validation, rejections."""

from __future__ import annotations

from waltz.v1 import server_pb2

from .fakes import FakeStream
from .harness import mounted_client, opened, run, settle
from .helpers import append, mount

Reason = server_pb2.AppendRejected.Reason


def test_appends_commit_with_dense_ids_in_batches():
    async def scenario():
        partition, store, stream = await mounted_client()
        store.gate.clear()
        await partition.submit(stream, [append(seq=1)])
        await settle()
        await partition.submit(stream, [append(seq=s) for s in range(2, 201)])
        store.gate.set()
        await stream.wait_for(lambda s: len(s.fed()) == 200)
        assert stream.fed() == [(i, i + 1) for i in range(200)]
        assert partition.high_water_mark == 199
        assert len(store.batches) < 200 and sum(store.batches) == 200
        assert store.batches[0] == 1 and store.batches[1] == 199
        await partition.close()

    run(scenario)


def test_batches_respect_max_batch_size():
    async def scenario():
        from dataclasses import replace

        from .harness import SMALL

        partition, store = await opened(settings=replace(SMALL, max_batch_size=7))
        stream = FakeStream()
        partition.mount(stream, mount())
        store.gate.clear()
        await partition.submit(stream, [append(seq=s) for s in range(1, 31)])
        store.gate.set()
        await stream.wait_for(lambda s: len(s.fed()) == 30)
        assert max(store.batches) <= 7
        await partition.close()

    run(scenario)


def test_bad_input_gets_a_precise_rejection_and_the_partition_goes_on():
    async def scenario():
        from dataclasses import replace

        from .harness import SMALL

        partition, _ = await opened(settings=replace(SMALL, max_transaction_bytes=10))
        stream = FakeStream()
        partition.mount(stream, mount())
        bad_checksum = append(seq=1)
        bad_checksum.checksum += 1
        bad_length = append(seq=2)
        bad_length.data_length = 5
        bad_locks = append(seq=3, write=(1, 2))
        bad_locks.write_lock_request_length = 1
        oversized = append(seq=4, data=b"x" * 11)
        await partition.submit(stream, [bad_checksum, bad_length, bad_locks, oversized, append(seq=5)])
        await stream.wait_for(lambda s: len(s.fed()) == 1)
        rejections = stream.of("append_rejected")
        assert [r.req_id.seq_num for r in rejections] == [1, 2, 3, 4]
        assert all(r.reason == Reason.INVALID for r in rejections)
        assert "checksum" in rejections[0].message
        assert "data_length 5" in rejections[1].message
        assert "write_lock_request_length 1" in rejections[2].message
        assert "server.maxTransactionBytes=10" in rejections[3].message
        assert stream.fed() == [(0, 5)]
        await partition.close()

    run(scenario)


def test_wrong_generation_is_rejected():
    async def scenario():
        partition, _ = await opened(generation=3)
        stream = FakeStream()
        partition.mount(stream, mount(generation=3))
        await partition.submit(stream, [append(seq=1, generation=2), append(seq=2, generation=3)])
        await stream.wait_for(lambda s: len(s.fed()) == 1)
        [rejection] = stream.of("append_rejected")
        assert rejection.reason == Reason.WRONG_GENERATION and rejection.req_id.seq_num == 1
        assert "generation 3" in rejection.message
        assert stream.fed() == [(0, 2)]
        await partition.close()

    run(scenario)


def test_append_without_mount_is_rejected_not_mounted():
    async def scenario():
        partition, _ = await opened()
        stream = FakeStream()
        await partition.submit(stream, [append(seq=1)])
        [rejection] = stream.of("append_rejected")
        assert rejection.reason == Reason.NOT_MOUNTED
        assert partition.high_water_mark == -1
        await partition.close()

    run(scenario)


def test_full_append_queue_holds_the_submitter_back():
    async def scenario():
        import asyncio
        from dataclasses import replace

        from .harness import SMALL

        partition, store = await opened(settings=replace(SMALL, append_queue_size=3))
        stream = FakeStream()
        partition.mount(stream, mount())
        store.gate.clear()
        submitting = asyncio.create_task(partition.submit(stream, [append(seq=s) for s in range(1, 11)]))
        await settle(50)
        assert not submitting.done()
        assert partition.pending_appends() == 3
        store.gate.set()
        await submitting
        await stream.wait_for(lambda s: len(s.fed()) == 10)
        await partition.close()

    run(scenario)


def test_close_refuses_queued_appends():
    async def scenario():
        partition, store, stream = await mounted_client()
        store.gate.clear()
        await partition.submit(stream, [append(seq=1)])
        await settle()
        await partition.submit(stream, [append(seq=2), append(seq=3)])
        await partition.close()
        rejections = stream.of("append_rejected")
        assert [r.req_id.seq_num for r in rejections] == [2, 3]  # 1 was at the store: its fate is the store's
        assert all(r.reason == Reason.PARTITION_NOT_READY for r in rejections)

    run(scenario)


def test_the_records_a_partition_hands_the_store_encode_as_its_requests_do():
    """The partition packs each append's record once, when it takes it (pending_batch): every batch's storage
    request is byte for byte the one store.wire builds from the batch's AppendRequests, whatever the clients,
    headers, data and rejections in between; and the feed carries each append's whole ReqId and header."""
    import random

    from waltz_server.pending_batch import storage_append_request
    from waltz_server.store.wire import append_pending_request

    from .fakes import FakeStore

    class Encoding(FakeStore):
        def __init__(self) -> None:
            super().__init__(0)
            self.requests: list[tuple[bytes, bytes]] = []

        def _begin(self, records):
            first = len(self.records)
            ours = storage_append_request(9, 0, first, records, first - 1).SerializeToString()
            theirs = append_pending_request(9, 0, first, list(records), first - 1).SerializeToString()
            self.requests.append((ours, theirs))
            return super()._begin(records)

    async def scenario():
        rng = random.Random(34)
        partition, store = await opened(Encoding())
        streams = {client: FakeStream() for client in (1, 2, 3)}
        for client, stream in streams.items():
            partition.mount(stream, mount(client_id=client))
        seqs = dict.fromkeys(streams, 0)
        accepted = []
        for _ in range(30):
            client = rng.choice(list(streams))
            batch = []
            for _ in range(rng.randrange(1, 40)):
                seqs[client] += 1
                data = rng.randbytes(rng.choice([0, 1, 100, 600]))
                request = append(client_id=client, seq=seqs[client], data=data, header=rng.randint(-(2**31), 2**31 - 1))
                if rng.random() < 0.1:
                    request.checksum ^= 1  # rejected: it must not shift the records after it
                else:
                    accepted.append(request)
                batch.append(request)
            await partition.submit(streams[client], batch)
        await settle(50)
        assert partition.high_water_mark == len(accepted) - 1
        assert store.requests and all(ours == theirs for ours, theirs in store.requests)
        fed = [f for batch in streams[1].of("feed") for f in batch.transactions]
        assert [(f.transaction_id, f.req_id, f.header) for f in fed] == [
            (i, r.req_id, r.header) for i, r in enumerate(accepted)
        ]
        await partition.close()

    run(scenario)
