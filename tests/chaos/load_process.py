"""A load generator that runs as a process of its own: one AsyncWaltzClient, many concurrent submitters.

    python -m tests.chaos.load_process --config client.json --out DIR/load-0 [--submitters 20]
        [--lock-share 0.33] [--locks 8] [--pace 0.005] [--max-seconds 600]

The exactly-once scenarios (tests/chaos/test_exactly_once.py, scripts/soak) start several of these, so that the
load comes from several real client processes, each with its own client id, streams and submissions, as an
application's instances would. Each submitter submits one transaction after another, round-robin over the
partitions; a share of them take one write lock of a few, and record in their payload the id of the last
transaction holding that lock that their execute() saw, so that the checker (load_history.py) can prove each
lock's chain of writers unbroken: a writer that acted on a stale read would name an older predecessor.

It writes DIR.progress (JSON, rewritten about 5 times a second: submitted, acknowledged, problems its application
saw) and appends to DIR.acks (a line per acknowledgement: time.monotonic(), which every process on the machine shares,
and the partition) while it runs. It stops submitting once the file DIR.stop exists (or after --max-seconds), waits
for every submission to end, and writes DIR.jsonl: one line per submission with its id, partition, lock, outcome,
executions, completion hooks and error, then exits 0.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import random
import threading
import time
from pathlib import Path
from typing import Any

from waltz_client import AsyncWaltzClient, Transaction, TransactionBuilder, TransactionContext, WaltzClientCallbacks
from waltz_client.locks import PartitionLocalLock

LOCK_NAME = "account"


class LockState(WaltzClientCallbacks):
    """The application's state: per partition, how far it applied, and the last writer of each lock."""

    def __init__(self) -> None:
        self.applied: dict[int, int] = {}
        self.last_writer: dict[tuple[int, int], int] = {}  # (partition, lock id) -> transaction id
        self.problems: list[str] = []
        self._lock = threading.Lock()

    def get_client_high_water_mark(self, partition_id: int) -> int:
        return self.applied.get(partition_id, -1)

    def apply_transaction(self, transaction: Transaction) -> None:
        """The header names the lock a transaction wrote (lock + 1; 0: none): no data to fetch."""
        pid, tid = transaction.partition_id, transaction.transaction_id
        with self._lock:
            if tid != self.applied.get(pid, -1) + 1:
                self.problems.append(f"partition {pid}: applied {tid} after {self.applied.get(pid, -1)}")
            self.applied[pid] = tid
            if transaction.header:
                self.last_writer[(pid, transaction.header - 1)] = tid

    def uncaught_exception(self, partition_id: int, transaction_id: int, exc: BaseException) -> None:
        self.problems.append(f"partition {partition_id} transaction {transaction_id}: {exc!r}")


class Submission(TransactionContext):
    """One transaction with a unique id; its payload is rebuilt at each execute (the lock's predecessor)."""

    def __init__(self, state: LockState, ident: str, partition: int, lock: int | None) -> None:
        self.state = state
        self.ident = ident
        self.partition = partition
        self.lock = lock
        self.executions = 0
        self.completions: list[bool] = []
        self.outcome: str = "pending"
        self.error = ""

    def partition_id(self, num_partitions: int) -> int:
        return self.partition % num_partitions

    def execute(self, builder: TransactionBuilder) -> bool:
        self.executions += 1
        payload: dict[str, Any] = {"id": self.ident, "p": self.partition, "x": self.executions}
        if self.lock is not None:
            payload["lock"] = self.lock
            payload["prev"] = self.state.last_writer.get((self.partition, self.lock), -1)
            builder.set_write_locks([PartitionLocalLock(LOCK_NAME, self.lock)])
            builder.set_header(self.lock + 1)
        builder.set_data(json.dumps(payload, separators=(",", ":")).encode())
        return True

    def on_completion(self, committed: bool) -> None:
        self.completions.append(committed)

    def record(self) -> dict[str, Any]:
        return {
            "id": self.ident,
            "p": self.partition,
            "lock": self.lock,
            "outcome": self.outcome,
            "error": self.error,
            "executions": self.executions,
            "completions": self.completions,
        }


class Load:
    def __init__(self, client: AsyncWaltzClient, state: LockState, args: argparse.Namespace, name: str) -> None:
        self.client = client
        self.state = state
        self.args = args
        self.name = name
        self.submissions: list[Submission] = []
        self.futures: list[asyncio.Future[bool]] = []
        self.acknowledged = 0
        self.acks: list[str] = []  # not yet written to the .acks file
        self.stop = asyncio.Event()
        self.random = random.Random(args.seed)

    async def submitter(self, index: int) -> None:
        seq = 0
        partitions = self.client.num_partitions
        while not self.stop.is_set():
            ident = f"{self.name}:{index}:{seq}"
            lock = self.random.randrange(self.args.locks) if self.random.random() < self.args.lock_share else None
            submission = Submission(self.state, ident, (index + seq) % partitions, lock)
            seq += 1
            self.submissions.append(submission)
            try:
                future = await self.client.submit(submission)
            except Exception as exc:  # never sent: no slot or no mount in time
                submission.outcome, submission.error = "not-sent", f"{type(exc).__name__}: {exc}"
                await asyncio.sleep(0.1)
                continue
            self.futures.append(future)
            try:
                committed = await future
            except Exception as exc:
                submission.outcome, submission.error = "raised", f"{type(exc).__name__}: {exc}"
            else:
                submission.outcome = "committed" if committed else "declined"
                if committed:
                    self.acknowledged += 1
                    self.acks.append(f"{time.monotonic():.6f} {submission.partition % partitions}\n")
            if self.args.pace:
                await asyncio.sleep(self.args.pace)

    async def report(self, prefix: Path) -> None:
        while True:
            self.write_progress(prefix)
            await asyncio.sleep(0.2)

    def write_progress(self, prefix: Path) -> None:
        if self.acks:
            with prefix.with_suffix(".acks").open("a") as f:
                f.write("".join(self.acks))
            self.acks.clear()
        progress = {
            "submitted": len(self.submissions),
            "acknowledged": self.acknowledged,
            "problems": self.state.problems[:20],
        }
        path = prefix.with_suffix(".progress")
        temporary = path.with_suffix(".tmp")
        temporary.write_text(json.dumps(progress))
        os.replace(temporary, path)


async def main_async(args: argparse.Namespace) -> None:
    out = Path(args.out)
    config = json.loads(Path(args.config).read_text())
    state = LockState()
    stop_file = out.with_suffix(".stop")
    async with AsyncWaltzClient(state, config) as client:
        await client.wait_mounted()
        load = Load(client, state, args, out.name)
        reporter = asyncio.create_task(load.report(out))
        tasks = [asyncio.create_task(load.submitter(i)) for i in range(args.submitters)]
        deadline = time.monotonic() + args.max_seconds
        while not stop_file.exists() and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        load.stop.set()
        _, pending = await asyncio.wait(tasks, timeout=args.drain_seconds)
        for task in pending:
            task.cancel()
        reporter.cancel()
        load.write_progress(out)
        with out.with_suffix(".jsonl").open("w") as f:
            for submission in load.submissions:
                f.write(json.dumps(submission.record()) + "\n")
            f.write(json.dumps({"fed_problems": state.problems, "undrained": len(pending)}) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True, help="the client configuration, a JSON object of dotted keys")
    parser.add_argument("--out", required=True, help="path prefix of the .progress, .stop and .jsonl files")
    parser.add_argument("--submitters", type=int, default=20)
    parser.add_argument("--lock-share", type=float, default=0.33, help="share of submissions with a write lock")
    parser.add_argument("--locks", type=int, default=8, help="distinct lock ids per partition")
    parser.add_argument("--pace", type=float, default=0.005, help="seconds each submitter rests between submissions")
    parser.add_argument("--max-seconds", type=float, default=86400.0, help="stop by itself after this long")
    parser.add_argument("--drain-seconds", type=float, default=150.0)
    parser.add_argument("--seed", type=int, default=None)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("waltz_client.submission").setLevel(logging.INFO)
    asyncio.run(main_async(args))


if __name__ == "__main__":
    main()
