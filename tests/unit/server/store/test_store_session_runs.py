"""StoreSession.record_run: a raw read's parts merged, a corrupt replica skipped (and its damage looked for), and
a node that predates raw reads still read as runs."""

from __future__ import annotations

import dataclasses

from waltz_server.record_runs import Run
from waltz_server.store.session_end import SessionRestart
from waltz_storage.codec import decode_records

from .fakes import FakeReplica
from .test_store_session import FAST, A, B, C, Harness, ended, pending, run, until


def decoded(got: Run) -> list[tuple]:
    """The run's records as the storage node decodes them (every check of the data file's reads)."""
    return decode_records(got.records, [0, *got.ends], got.first)


def fields(records) -> list[tuple]:
    return [
        (r.transaction_id, r.req_id.client_id, r.req_id.generation, r.req_id.partition_id, r.req_id.seq_num,
         r.header, r.data, r.checksum)
        for r in records
    ]


async def appended(h: Harness, count: int) -> None:
    """Once all three replicas are members: count transactions committed and held by every one."""
    await until(lambda: len(h.session.members) == 3)
    await h.session.append(pending(count))
    await h.session.drain()


def test_a_run_is_the_records_read_in_parts_and_merged() -> None:
    async def test() -> None:
        h = Harness({A: FakeReplica(), B: FakeReplica(), C: FakeReplica()})
        async with h.running():
            await appended(h, 7)
            for replica in h.replicas.values():
                replica.max_list = 2  # every node answers in parts of two
            got = await h.session.record_run(1, 10)  # clamped to the high-water mark, 6
            assert (got.first, len(got)) == (1, 6)
            assert decoded(got) == fields(await h.session.records(1, 10))
            assert decoded(await h.session.record_run(3, 2)) == fields(await h.session.records(3, 2))
            empty = await h.session.record_run(7, 5)
            assert (empty.first, len(empty), empty.records) == (7, 0, b"")

    run(test)


def test_a_corrupt_run_is_read_from_another_replica_and_its_damage_looked_for_at_once() -> None:
    async def test() -> None:
        settings = dataclasses.replace(FAST, damage_check_interval_s=3600.0)  # only a CORRUPTED read asks now
        h = Harness({A: FakeReplica(), B: FakeReplica(), C: FakeReplica()}, settings=settings)
        async with h.running() as task:
            await appended(h, 5)
            h.replicas[A].corrupt_reads = True  # the preferred reader (first by name)
            h.replicas[A].damaged = [2]
            got = await h.session.record_run(0, 5)
            h.replicas[A].corrupt_reads = False
            assert decoded(got) == fields(await h.session.records(0, 5))
            reason = await ended(task)
            assert isinstance(reason, SessionRestart) and A in str(reason)

    run(test)


def test_a_node_that_answers_a_raw_read_with_records_is_read_as_runs_all_the_same() -> None:
    async def test() -> None:
        h = Harness({A: FakeReplica(), B: FakeReplica(), C: FakeReplica()})
        async with h.running():
            await appended(h, 4)
            new = await h.session.record_run(0, 4)
            for replica in h.replicas.values():
                replica.ignores_raw = True
                replica.max_list = 3
            old = await h.session.record_run(0, 4)
            assert (old.first, old.records, old.ends) == (new.first, new.records, new.ends)

    run(test)
