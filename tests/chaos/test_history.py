"""The checker of tests/chaos catches each anomaly it is there for (no cluster needed)."""

from __future__ import annotations

from tests.chaos.history import Append, check, compare_replicas
from waltz_client import WaltzTimeoutError
from waltz_common.types import Record, ReqId, crc32


def history(count: int = 4) -> list[Append]:
    appends = [Append("r", i, i % 2) for i in range(count)]
    for a in appends:
        a.executions, a.completions, a.outcome = 1, [True], True
    return appends


def log_of(appends: list[Append], partitions: int = 2) -> dict[int, list[Record]]:
    log: dict[int, list[Record]] = {p: [] for p in range(partitions)}
    for a in appends:
        records = log[a.partition]
        records.append(Record(len(records), ReqId(1, 1, a.partition, a.seq), 0, a.data, crc32(a.data)))
    return log


def renumbered(records: list[Record]) -> list[Record]:
    return [Record(i, r.req_id, r.header, r.data, r.checksum) for i, r in enumerate(records)]


def test_a_correct_run_passes() -> None:
    appends = history()
    verdict = check(appends, log_of(appends), 2)
    assert verdict.problems == [] and verdict.acknowledged == 4 and verdict.records == {0: 2, 1: 2}


def test_a_lost_acknowledged_append_is_found() -> None:
    appends = history()
    log = log_of(appends)
    log[1] = renumbered(log[1][1:])
    assert any("(acknowledged) lost" in p for p in check(appends, log, 2).problems)


def test_a_duplicate_is_found_even_for_an_indeterminate_append() -> None:
    appends = history()
    appends[0].outcome, appends[0].completions = WaltzTimeoutError("t"), []
    log = log_of(appends)
    log[0] = renumbered([*log[0], log[0][0]])
    assert any("duplicated" in p for p in check(appends, log, 2).problems)
    single = log_of(appends)
    assert check(appends, single, 2).problems == []  # indeterminate: at most once is fine


def test_gaps_foreign_records_wrong_partitions_and_bad_checksums_are_found() -> None:
    appends = history()
    log = log_of(appends)
    gap = log[0][1]
    log[0][1] = Record(5, gap.req_id, gap.header, gap.data, gap.checksum)
    log[1].append(Record(2, ReqId(9, 1, 1, 1), 0, b"nobody", crc32(b"other")))
    log[1].append(Record(3, log[0][0].req_id, 0, log[0][0].data, log[0][0].checksum))
    problems = " | ".join(check(appends, log, 2).problems)
    for expected in ("not dense", "no submission made", "checksum", "was for another one", "duplicated"):
        assert expected in problems, expected


def test_a_declined_append_in_the_log_and_hooks_that_disagree_are_found() -> None:
    appends = history()
    appends[1].outcome, appends[1].completions = False, [False]
    appends[2].completions = [True, True]
    problems = " | ".join(check(appends, log_of(appends), 2).problems)
    assert "declined but is in the log" in problems and "completion hooks [True, True]" in problems


def test_replicas_that_differ_from_the_log_are_named() -> None:
    appends = history()
    log = log_of(appends)
    other = log_of(appends)
    other[1] = other[1][:1]
    changed = log_of(appends)
    changed[0][0] = Record(0, ReqId(1, 2, 0, 0), 0, changed[0][0].data, changed[0][0].checksum)
    problems = compare_replicas({"a": log, "b": other, "c": changed}, log)
    assert (
        len(problems) == 2 and problems[0].startswith("b partition 1: 1 records") and "record 0 differs" in problems[1]
    )
