"""A lagging replica joins the write set even when appends follow each other without a pause."""

from __future__ import annotations

from .fakes import FakeReplica
from .test_store_session import A, B, C, Harness, in_session, pending, run, until

BOUND = 3000  # appends; the replica joined after about 150 here, and never before the fix


def test_a_lagging_replica_joins_under_a_steady_stream_of_appends() -> None:
    """It used to join only at a moment with no batch in flight: every time it got the append lock,
    another batch had committed meanwhile, so with appends back to back it copied for ever and the
    partition ran on two of three replicas (tests/chaos: a restarted storage node under load)."""

    async def test() -> None:
        replicas = {A: FakeReplica(9, 0, -1), B: FakeReplica(9, 0, -1), C: FakeReplica(4, 0, -1)}
        h = Harness(replicas, offline=(C,), session_id=1, previous=in_session(0, A, B, C))
        async with h.running():
            await h.session.ready.wait()
            for i in range(20):
                await h.session.append(pending(1, f"before{i}-"))
            h.pool.get(C).up()
            appended = 0
            while len(h.session.members) < 3 and appended < BOUND:
                await h.session.append(pending(1, f"w{appended}-"))
                appended += 1
            assert h.session.members == (A, B, C), f"not joined after {appended} appends"
            await h.session.append(pending(1, "last"))
            await h.session.drain()
            await until(lambda: h.log(C) == h.log(A))
            assert h.log(A) == h.log(B) and len(h.log(A)) == 10 + 20 + appended + 1

    run(test)
