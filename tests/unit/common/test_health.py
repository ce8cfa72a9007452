"""HealthBook: which health names changed, and which are no longer reported."""

from __future__ import annotations

import asyncio

from grpc_health.v1 import health

from waltz_common.health import NOT_SERVING, SERVICE_UNKNOWN, SERVING, HealthBook, Verdict, apply, keep_health


def test_only_changes_are_reported():
    book = HealthBook()
    first = {"": Verdict(True), "p/1": Verdict(False, "no quorum")}
    assert book.update(first) == first
    assert book.update(first) == {}
    assert book.update({"": Verdict(True), "p/1": Verdict(False, "recovery undecidable")}) == {
        "p/1": Verdict(False, "recovery undecidable")
    }


def test_a_name_dropped_is_reported_as_none():
    book = HealthBook()
    book.update({"": Verdict(True), "p/1": Verdict(True)})
    assert book.update({"": Verdict(True)}) == {"p/1": None}
    assert book.update({"": Verdict(True)}) == {}


def test_apply_sets_statuses_and_unknown_for_dropped_names():
    async def scenario() -> dict[str, int]:
        servicer = health.aio.HealthServicer()
        book = HealthBook()
        await apply(servicer, book, {"": Verdict(True), "p/1": Verdict(False, "no quorum")})
        await apply(servicer, book, {"": Verdict(False, "ZooKeeper lost")})
        return dict(servicer._server_status)

    assert asyncio.run(scenario()) == {"": NOT_SERVING, "p/1": SERVICE_UNKNOWN}


def test_verdict_status():
    assert Verdict(True).status == SERVING
    assert Verdict(False, "why").status == NOT_SERVING


def test_keep_health_survives_a_failing_verdict_and_follows_nudges():
    calls = []

    def verdicts() -> dict[str, Verdict]:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("a bug")
        return {"": Verdict(len(calls) >= 3, "starting")}

    async def scenario() -> list[int]:
        servicer = health.aio.HealthServicer()
        nudge = asyncio.Event()
        task = asyncio.create_task(keep_health(servicer, verdicts, nudge, interval_s=60))
        seen = []
        for _ in range(2):
            await asyncio.sleep(0.05)
            nudge.set()  # without it the next round would come only after 60 s
            await asyncio.sleep(0.05)
            seen.append(servicer._server_status[""])
        task.cancel()
        return seen

    assert asyncio.run(scenario()) == [NOT_SERVING, SERVING]
