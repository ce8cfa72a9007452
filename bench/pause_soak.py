"""No false failovers: 100 writers for 10 minutes, the owner of partition 0 stopped for 1 s every minute.

    .venv/bin/python -m bench.pause_soak [--minutes 10] [--writers 100] [--pause 1] [--every 60] [--dir DIR]

A LocalCluster (3 storage replicas, 2 servers, 4 partitions, default server keys: the failure detector on) and,
in this process, an AsyncWaltzClient whose writers append 512 B transactions in a closed loop, spread over the
partitions, the whole time: the servers and this process share the machine's cores, so the servers are busy.
Every `--every` seconds the server owning partition 0 gets SIGSTOP, and SIGCONT `--pause` seconds later (a
stop-the-world pause). The failure detector must not take any of these for a death: at the end the assignment
must be exactly what it was at the start (every partition with the same server and generation, the assignment
znode never rewritten). Prints a line per pause and a summary; exits 1 when a partition moved.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench.append_bench import WRITER_CLIENT
from bench.append_writers import Append, CountingCallbacks
from bench.curves.common import wait_owned
from waltz.v1 import metadata_pb2
from waltz_client import AsyncWaltzClient
from waltz_common import zk as zkmeta
from waltz_common.testing.local_cluster import LocalCluster

PARTITIONS = 4


@dataclass
class Outcome:
    pauses: int = 0
    commits: int = 0
    errors: int = 0
    seconds: float = 0.0
    longest_gap_s: float = 0.0  # the longest time without any commit
    before: dict[int, tuple[int, int]] = field(default_factory=dict)  # partition -> (server, generation)
    after: dict[int, tuple[int, int]] = field(default_factory=dict)
    rewrites: int = 0  # times the assignment znode was written during the run
    lines: list[str] = field(default_factory=list)

    @property
    def moved(self) -> list[int]:
        return sorted(p for p in self.before if self.after.get(p) != self.before[p])

    def summary(self) -> list[str]:
        return [
            *self.lines,
            f"{self.pauses} pauses, {self.commits:,} commits in {self.seconds:.0f} s "
            f"({self.commits / max(self.seconds, 1e-9):,.0f}/s), {self.errors} failed appends (submitted again), "
            f"longest time without a commit {self.longest_gap_s:.2f} s; load average {os.getloadavg()[0]:.2f}",
            f"assignment (partition: server, generation) {self.before} -> {self.after}; assignment rewritten "
            f"{self.rewrites} times; partitions moved: {self.moved or 'none'}",
        ]


def _assignment(cluster: LocalCluster) -> tuple[dict[int, tuple[int, int]], int]:
    """partition -> (server, generation), and the assignment znode's version."""
    zk = zkmeta.connect(cluster.zookeeper)
    try:
        message, stat = zkmeta.require(zk, cluster.paths.server_assignment, metadata_pb2.ServerAssignment)
        return {p.partition_id: (p.server_id, p.generation) for p in message.partitions}, stat.version
    finally:
        zk.stop()
        zk.close()


async def _run(cluster: LocalCluster, seconds: float, writers: int, pause_s: float, every_s: float) -> Outcome:
    outcome = Outcome()
    config = {**cluster.client_config(**WRITER_CLIENT), "client.maxConcurrentTransactions": writers}
    last_commit = time.monotonic()
    stop = asyncio.Event()
    async with AsyncWaltzClient(CountingCallbacks(-1), config) as client:
        await client.wait_mounted()
        outcome.before, version = await asyncio.to_thread(_assignment, cluster)

        async def writer(partition: int) -> None:
            nonlocal last_commit
            payload = b"p" * 512
            while not stop.is_set():
                try:
                    await (await client.submit(Append(payload, partition)))
                except Exception:
                    outcome.errors += 1
                    await asyncio.sleep(0.01)
                    continue
                now = time.monotonic()
                outcome.longest_gap_s = max(outcome.longest_gap_s, now - last_commit)
                last_commit = now
                outcome.commits += 1

        tasks = [asyncio.create_task(writer(i % PARTITIONS)) for i in range(writers)]
        started = time.monotonic()
        last_commit = started
        try:
            while time.monotonic() - started + every_s <= seconds + 1e-6:
                await asyncio.sleep(every_s - pause_s)
                owner_id = outcome.before[0][0]
                owner = next(s for s in cluster.servers if s.running and _serves(cluster, s.address, owner_id))
                assert owner.process is not None
                committed = outcome.commits
                owner.process.send_signal(signal.SIGSTOP)
                try:
                    await asyncio.sleep(pause_s)
                finally:
                    owner.process.send_signal(signal.SIGCONT)
                outcome.pauses += 1
                now, _ = await asyncio.to_thread(_assignment, cluster)
                at = time.monotonic() - started
                outcome.lines.append(
                    f"pause {outcome.pauses} of server {owner_id} ({pause_s:g} s) at {at:.0f} s:"
                    f" {outcome.commits - committed} commits meanwhile, assignment "
                    f"{'unchanged' if now == outcome.before else now}")
            await asyncio.sleep(max(0.0, seconds - (time.monotonic() - started)))
        finally:
            stop.set()
            await asyncio.gather(*tasks)
        outcome.seconds = time.monotonic() - started
        outcome.after, final_version = await asyncio.to_thread(_assignment, cluster)
        outcome.rewrites = final_version - version
    return outcome


def _serves(cluster: LocalCluster, address: str, server_id: int) -> bool:
    zk = zkmeta.connect(cluster.zookeeper)
    try:
        descriptor = zkmeta.require(zk, cluster.paths.server(server_id), metadata_pb2.ServerDescriptor)[0]
        return f"{descriptor.host}:{descriptor.port}" == address
    finally:
        zk.stop()
        zk.close()


def run_pause_soak(workdir: Path, seconds: float, writers: int = 100, pause_s: float = 1.0,
                   every_s: float = 60.0) -> Outcome:
    with LocalCluster(workdir, servers=2, partitions=PARTITIONS) as cluster:
        wait_owned(cluster, PARTITIONS)
        return asyncio.run(_run(cluster, seconds, writers, pause_s, every_s))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--writers", type=int, default=100)
    parser.add_argument("--pause", type=float, default=1.0, help="seconds each SIGSTOP lasts")
    parser.add_argument("--every", type=float, default=60.0, help="seconds from one pause to the next")
    parser.add_argument("--dir", default=None, help="work directory (default: a temporary one)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("kazoo").setLevel(logging.ERROR)
    with tempfile.TemporaryDirectory(prefix="waltz-pause-", dir=args.dir) as workdir:
        outcome = run_pause_soak(Path(workdir), args.minutes * 60, args.writers, args.pause, args.every)
    print("\n".join(outcome.summary()))
    return 1 if outcome.moved or outcome.rewrites else 0


if __name__ == "__main__":
    sys.exit(main())
