"""What a fault-injection run did and what the log holds, and the checks between the two.

The rule comes from the client's semantics (waltz_client.client.AsyncWaltzClient.submit): a
submission's future ends True only once the client saw its append's ReqId in the partition's
feed; an append the client inferred failed (superseded, remounted, flushed) is re-executed and
sent again under a new ReqId, so one submission may be *sent* several times but must be
*committed* at most once. Hence, for unique payloads:

- resolved True: in the log exactly once, in the partition it was submitted to;
- resolved False (execute declined): never sent, never in the log;
- raised: indeterminate (e.g. the client closed with the append in flight): at most once;
- every record in the log is one of the run's submissions (nothing invented or garbled);
- ids per partition are exactly 0..high-water mark (dense, no gaps, no repeats);
- the log a fresh consumer reads and every storage replica's records are the same records.

These are the Jepsen-style checks: lost write, duplicate, inconsistent offsets (one id, two
payloads), aborted read (a failed write seen), gaps.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections import Counter
from dataclasses import dataclass, field

from waltz_client import TransactionBuilder, TransactionContext
from waltz_common.types import Record, crc32


class Append(TransactionContext):
    """One submission with a unique JSON payload; remembers how often execute ran."""

    def __init__(self, run: str, seq: int, partition: int) -> None:
        self.partition = partition
        self.seq = seq
        self.data = json.dumps({"run": run, "seq": seq, "p": partition, "u": uuid.uuid4().hex}).encode()
        self.executions = 0
        self.lock_failures = 0
        self.completions: list[bool] = []
        self.outcome: bool | BaseException | None = None  # None: still pending
        self.acked_at: float | None = None  # time.monotonic() when acknowledged (set by the Writer)

    def partition_id(self, num_partitions: int) -> int:
        return self.partition % num_partitions

    def execute(self, builder: TransactionBuilder) -> bool:
        self.executions += 1
        builder.set_data(self.data)
        return True

    def on_completion(self, committed: bool) -> None:
        self.completions.append(committed)

    def on_lock_failure(self) -> None:
        self.lock_failures += 1

    def settle(self, future: asyncio.Future[bool]) -> None:
        if future.cancelled():
            self.outcome = asyncio.CancelledError()
        else:
            self.outcome = future.exception() or future.result()


@dataclass
class Verdict:
    """What the checks found; `problems` is empty when the run is correct."""

    submitted: int = 0
    acknowledged: int = 0
    declined: int = 0
    raised: int = 0
    pending: int = 0
    resent: int = 0  # submissions executed more than once (an attempt was inferred failed)
    records: dict[int, int] = field(default_factory=dict)  # partition -> records in the log
    problems: list[str] = field(default_factory=list)

    def summary(self) -> str:
        per_partition = ", ".join(f"p{p}: ids 0..{n - 1}" for p, n in sorted(self.records.items()))
        return (
            f"{self.submitted} submitted, {self.acknowledged} acknowledged, {self.raised} raised, "
            f"{self.declined} declined, {self.pending} pending, {self.resent} re-sent; log {per_partition}"
        )


def check(appends: list[Append], log: dict[int, list[Record]], num_partitions: int) -> Verdict:
    """Compare the run's submissions with the log (partition -> records in id order)."""
    verdict = Verdict(submitted=len(appends))
    problems = verdict.problems
    by_payload = {a.data: a for a in appends}
    seen: Counter[bytes] = Counter()
    where: dict[bytes, list[tuple[int, int]]] = {}
    for pid in range(num_partitions):
        records = log.get(pid, [])
        verdict.records[pid] = len(records)
        ids = [r.transaction_id for r in records]
        if ids != list(range(len(ids))):
            problems.append(f"partition {pid}: ids are not dense 0..{len(ids) - 1}: {_describe_ids(ids)}")
        for r in records:
            if r.checksum != crc32(r.data):
                problems.append(f"partition {pid} id {r.transaction_id}: checksum does not match the data")
            seen[r.data] += 1
            where.setdefault(r.data, []).append((pid, r.transaction_id))
            owner = by_payload.get(r.data)
            if owner is None:
                problems.append(f"partition {pid} id {r.transaction_id}: a record no submission made: {r.data[:80]!r}")
            elif owner.partition % num_partitions != pid:
                problems.append(f"partition {pid} id {r.transaction_id}: submission {owner.seq} was for another one")
    for a in appends:
        count = seen[a.data]
        if a.executions > 1:
            verdict.resent += 1
        if a.completions.count(True) > 1 or (True in a.completions) != (a.outcome is True):
            problems.append(f"submission {a.seq}: completion hooks {a.completions} for outcome {a.outcome!r}")
        if a.outcome is True:
            verdict.acknowledged += 1
            if count != 1:
                kind = "lost" if count == 0 else "duplicated"
                problems.append(
                    f"submission {a.seq} (acknowledged) {kind}: in the log {count} times {where.get(a.data)}"
                )
        elif a.outcome is False:
            verdict.declined += 1
            if count:
                problems.append(f"submission {a.seq} was declined but is in the log at {where[a.data]}")
        elif a.outcome is None:
            verdict.pending += 1
            if count > 1:
                problems.append(f"submission {a.seq} (pending) duplicated at {where[a.data]}")
        else:
            verdict.raised += 1
            if count > 1:
                problems.append(f"submission {a.seq} (raised {a.outcome!r}) duplicated at {where[a.data]}")
    return verdict


def compare_replicas(replicas: dict[str, dict[int, list[Record]]], log: dict[int, list[Record]]) -> list[str]:
    """Every replica holds exactly the records the consumer read, for every partition."""
    problems = []
    for name, partitions in replicas.items():
        for pid, records in log.items():
            held = partitions.get(pid, [])
            if held != records:
                problems.append(f"{name} partition {pid}: {_difference(held, records)}")
    return problems


def _difference(held: list[Record], expected: list[Record]) -> str:
    if len(held) != len(expected):
        return f"{len(held)} records, the log has {len(expected)}"
    first = next(i for i, (a, b) in enumerate(zip(held, expected, strict=True)) if a != b)
    return f"record {first} differs: {held[first]} != {expected[first]}"


def _describe_ids(ids: list[int]) -> str:
    if len(ids) <= 20:
        return str(ids)
    wrong = [(i, t) for i, t in enumerate(ids) if i != t][:5]
    return f"{len(ids)} ids, first mismatches (position, id): {wrong}"
