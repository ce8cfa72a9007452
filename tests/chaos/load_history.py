"""Several load processes (tests/chaos/load_process.py) against a cluster, and the check of what they were told
against the log and the replicas.

The checks, for every submission (a unique id; its payload changes between executions, so records are matched by
id, not by bytes):
- no submission in the log twice, whatever its outcome;
- acknowledged (its future ended True): in the log exactly once, in its partition;
- reported failed (RetriesExhaustedError: every attempt proven failed, or declined): not in the log;
- still pending or ended with another error (the client closed): at most once;
- on_completion(True) at most once, and only for an acknowledged submission;
- every record is one of the run's submissions; ids per partition are 0..high-water mark, dense;
- each lock's chain of writers is unbroken: every committed writer of a lock names, as the predecessor its
  execute saw, the writer of that lock just before it in the log (optimistic locking kept it from a stale read);
- every replica holds exactly the records a fresh consumer reads.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.chaos.cluster import CLIENT, PARTITIONS, read_everything, until
from tests.chaos.test_faults import identical_replicas
from waltz_common.testing.local_cluster import LocalCluster
from waltz_common.types import Record

ROOT = Path(__file__).resolve().parents[2]
LOAD_CLIENT = {
    **CLIENT,
    "client.maxConcurrentTransactions": 100,
    "client.maxRetries": 3,
}


@dataclass
class LoadVerdict:
    submitted: int = 0
    acknowledged: int = 0
    failed: int = 0
    indeterminate: int = 0
    resent: int = 0
    lock_writers: int = 0
    records: dict[int, int] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    def summary(self) -> str:
        log = ", ".join(f"p{p}: {n}" for p, n in sorted(self.records.items()))
        return (
            f"{self.submitted} submitted, {self.acknowledged} acknowledged, {self.failed} reported failed, "
            f"{self.indeterminate} indeterminate, {self.resent} executed more than once, {self.lock_writers} lock "
            f"writers in unbroken chains; records {log}; {len(self.problems)} problems"
        )


def check_load(submissions: list[dict[str, Any]], log: dict[int, list[Record]]) -> LoadVerdict:
    """The history of the load processes' submissions against the log (partition -> records in id order)."""
    verdict = LoadVerdict(submitted=len(submissions))
    problems = verdict.problems
    known = {s["id"]: s for s in submissions}
    where: dict[str, list[tuple[int, int]]] = {}
    chains: dict[tuple[int, int], int] = {}  # (partition, lock) -> the last writer's id so far
    for pid in sorted(log):
        records = log[pid]
        verdict.records[pid] = len(records)
        ids = [r.transaction_id for r in records]
        if ids != list(range(len(ids))):
            problems.append(f"partition {pid}: ids are not dense 0..{len(ids) - 1}")
        for record in records:
            try:
                payload = json.loads(record.data)
                ident = payload["id"]
            except (ValueError, KeyError, TypeError):
                problems.append(f"partition {pid} id {record.transaction_id}: not a payload of this run")
                continue
            where.setdefault(ident, []).append((pid, record.transaction_id))
            if ident not in known:
                problems.append(f"partition {pid} id {record.transaction_id}: {ident} was never submitted")
            if payload.get("p", -1) % PARTITIONS != pid:
                problems.append(f"partition {pid} id {record.transaction_id}: {ident} was for partition {payload['p']}")
            lock = payload.get("lock")
            if lock is not None:
                expected = chains.get((pid, lock), -1)
                if payload.get("prev") != expected:
                    problems.append(
                        f"partition {pid} lock {lock}: writer {record.transaction_id} ({ident}) read the lock at "
                        f"{payload.get('prev')}, but its last writer before it was {expected}: a stale read"
                    )
                else:
                    verdict.lock_writers += 1
                chains[(pid, lock)] = record.transaction_id
    for s in submissions:
        count = len(where.get(s["id"], []))
        outcome = s["outcome"]
        if s["executions"] > 1:
            verdict.resent += 1
        if count > 1:
            problems.append(f"{s['id']} ({outcome}) committed {count} times: {where[s['id']]}")
        if s["completions"].count(True) > 1 or (True in s["completions"]) != (outcome == "committed"):
            problems.append(f"{s['id']}: completion hooks {s['completions']} for outcome {outcome}")
        if outcome == "committed":
            verdict.acknowledged += 1
            if count == 0:
                problems.append(f"{s['id']} was acknowledged but is not in the log")
        elif outcome == "declined" or "RetriesExhaustedError" in s["error"]:
            verdict.failed += 1
            if count:
                problems.append(f"{s['id']} was reported failed ({s['error'] or outcome}) but committed at "
                                f"{where[s['id']]}")
        else:
            verdict.indeterminate += 1
    return verdict


class LoadProcesses:
    """Client processes, each running tests/chaos/load_process.py against one cluster; seen as one load
    (tests/chaos/timed.Load): their acknowledgements, read from the files they append to."""

    def __init__(self, workdir: Path, config: dict[str, Any], processes: int = 3, submitters: int = 20,
                 extra: tuple[str, ...] = ()) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        self.workdir = workdir
        config_path = workdir / "load-client.json"
        config_path.write_text(json.dumps({**config, **LOAD_CLIENT}))
        self.prefixes = [workdir / f"load-{i}" for i in range(processes)]
        self.procs: list[subprocess.Popen[bytes]] = []
        self._stopping = False
        self._read: list[int] = [0] * processes  # bytes of each .acks file read so far
        self._times: list[float] = []  # every acknowledgement's time.monotonic(), as read (not sorted)
        self._last_on: dict[int, float] = {}  # partition -> its latest acknowledgement
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        for prefix in self.prefixes:
            log = open(prefix.with_suffix(".log"), "wb")  # noqa: SIM115  # closed with the process
            self.procs.append(subprocess.Popen(
                [sys.executable, "-m", "tests.chaos.load_process", "--config", str(config_path), "--out",
                 str(prefix), "--submitters", str(submitters), *extra],
                cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
            ))
            log.close()

    def progress(self) -> list[dict[str, Any]]:
        found = []
        for prefix in self.prefixes:
            try:
                found.append(json.loads(prefix.with_suffix(".progress").read_text()))
            except (OSError, ValueError):
                found.append({"submitted": 0, "acknowledged": 0, "problems": []})
        return found

    def _poll(self) -> None:
        for index, prefix in enumerate(self.prefixes):
            try:
                with prefix.with_suffix(".acks").open("rb") as f:
                    f.seek(self._read[index])
                    chunk = f.read()
            except FileNotFoundError:
                continue
            complete = chunk[: chunk.rfind(b"\n") + 1]
            self._read[index] += len(complete)
            for line in complete.decode().splitlines():
                moment, partition = line.split()
                at = float(moment)
                self._times.append(at)
                if at > self._last_on.get(int(partition), 0.0):
                    self._last_on[int(partition)] = at

    @property
    def acknowledged(self) -> int:
        self._poll()
        return len(self._times)

    @property
    def submitted(self) -> int:
        return sum(p["submitted"] for p in self.progress())

    def acknowledgement_times(self) -> list[float]:
        self._poll()
        return sorted(self._times)

    def partitions_acknowledged_since(self, moment: float) -> set[int]:
        self._poll()
        return {p for p, at in self._last_on.items() if at > moment}

    def _check_alive(self) -> None:
        for prefix, proc in zip(self.prefixes, self.procs, strict=True):
            if proc.poll() is not None and (not self._stopping or not prefix.with_suffix(".jsonl").exists()):
                tail = prefix.with_suffix(".log").read_text(errors="replace")[-3000:]
                raise AssertionError(f"load process {prefix.name} exited {proc.returncode} before it was stopped:\n"
                                     f"{tail}")

    async def acknowledged_at_least(self, count: int, what: str, timeout: float = 120.0) -> int:
        def reached() -> bool:
            self._check_alive()
            return self.acknowledged >= count

        await until(reached, f"{count} acknowledged appends ({what})", timeout)
        return self.acknowledged

    async def each_acknowledged(self, what: str, timeout: float = 120.0) -> None:
        """Wait until every process has had an append acknowledged (each is connected and mounted: a slow start must
        not meet the fault, e.g. ZooKeeper already down when it looks the cluster up)."""

        def reached() -> bool:
            self._check_alive()
            return all(p["acknowledged"] > 0 for p in self.progress())

        await until(reached, f"an acknowledged append from each load process ({what})", timeout)

    async def stop(self, timeout: float = 200.0) -> list[dict[str, Any]]:
        """Stop submitting, wait for every process to end; every submission's record."""
        self._stopping = True
        for prefix in self.prefixes:
            prefix.with_suffix(".stop").touch()
        deadline = time.monotonic() + timeout
        while any(p.poll() is None for p in self.procs) and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        self.kill()
        self._check_alive()
        submissions: list[dict[str, Any]] = []
        for prefix in self.prefixes:
            lines = prefix.with_suffix(".jsonl").read_text().splitlines()
            tail = json.loads(lines[-1])
            assert not tail["fed_problems"], f"{prefix.name}: {tail['fed_problems']}"
            submissions += [json.loads(line) for line in lines[:-1]]
        return submissions

    def kill(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
                proc.wait()


async def read_checked(
    cluster: LocalCluster, submissions: list[dict[str, Any]], label: str, read_timeout: float = 120.0
) -> tuple[dict[int, list[Record]], LoadVerdict]:
    """The log a fresh consumer reads, and the history checks of submissions against it (printed after label)."""
    log = await read_everything({**cluster.client_config(), **CLIENT}, read_timeout)
    verdict = check_load(submissions, log)
    print(f"{label} {verdict.summary()}")
    assert not verdict.problems, verdict.problems[:20]
    return log, verdict


async def check_load_run(
    cluster: LocalCluster, submissions: list[dict[str, Any]], name: str, read_timeout: float = 120.0
) -> LoadVerdict:
    """The history checks, then the replicas against the log a fresh consumer read."""
    log, verdict = await read_checked(cluster, submissions, f"[exactly-once] {name}:", read_timeout)
    await identical_replicas(cluster, log)
    return verdict
