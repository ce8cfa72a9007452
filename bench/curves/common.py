"""What the curve benchmarks share: the load average record, CPU of processes, partition owners, fills, tables."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import psutil
from prometheus_client.parser import text_string_to_metric_families

from bench.baselines import cpu_seconds
from bench.raw_client import high_water_mark, raw_stream
from waltz.v1 import metadata_pb2
from waltz_common import zk as zkmeta
from waltz_common.testing.local_cluster import LocalCluster


@dataclass
class LoadLog:
    """The 1-minute load average at named moments of a run (the host is shared: every table says it)."""

    marks: list[tuple[str, float]] = field(default_factory=list)

    def mark(self, label: str) -> None:
        self.marks.append((label, os.getloadavg()[0]))

    def line(self) -> str:
        return "load average (1 min): " + "; ".join(f"{label} {value:.2f}" for label, value in self.marks)


class CpuMeter:
    """CPU seconds (user + system) of a set of processes since the meter was made."""

    def __init__(self, pids: dict[str, int]) -> None:
        self._processes = {name: psutil.Process(pid) for name, pid in pids.items()}
        self._start = self._now()

    def _now(self) -> dict[str, float]:
        return cpu_seconds(self._processes)

    def used(self) -> dict[str, float]:
        now = self._now()
        return {name: now[name] - self._start.get(name, 0.0) for name in now}


class CpuWindow:
    """Run (called) in the parent while client processes measure: the CPU seconds of processes over the
    clients' measured window (after their warmup)."""

    def __init__(self, pids: dict[str, int], warmup_s: float, run_s: float) -> None:
        self._pids = pids
        self._warmup_s = warmup_s
        self._run_s = run_s
        self.cpu: dict[str, float] = {}

    def __call__(self) -> None:
        time.sleep(self._warmup_s)
        meter = CpuMeter(self._pids)
        time.sleep(self._run_s)
        self.cpu = meter.used()

    def of(self, prefix: str) -> float:
        return sum(v for k, v in self.cpu.items() if k.startswith(prefix))


def owners(cluster: LocalCluster) -> dict[int, int]:
    """Partition id -> the id of the server that owns it, from ZooKeeper's assignment."""
    zk = zkmeta.connect(cluster.zookeeper)
    try:
        assignment = zkmeta.require(zk, cluster.paths.server_assignment, metadata_pb2.ServerAssignment)[0]
        return {o.partition_id: o.server_id for o in assignment.partitions}
    finally:
        zk.stop()
        zk.close()


def server_address(cluster: LocalCluster, server_id: int) -> str:
    """Where the server with that id listens (its descriptor in ZooKeeper)."""
    zk = zkmeta.connect(cluster.zookeeper)
    try:
        descriptor = zkmeta.require(zk, cluster.paths.server(server_id), metadata_pb2.ServerDescriptor)[0]
        return f"{descriptor.host}:{descriptor.port}"
    finally:
        zk.stop()
        zk.close()


def wait_owned(cluster: LocalCluster, partitions: int, timeout: float = 60.0) -> dict[int, str]:
    """Partition -> its owner's address, once every partition has an owner that answers for it."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            found = owners(cluster)
            if len(found) == partitions and all(s >= 0 for s in found.values()):
                addresses = {p: server_address(cluster, s) for p, s in found.items()}
                for p, address in addresses.items():
                    asyncio.run(high_water_mark(address, None, p))
                return addresses
        except Exception:
            if time.monotonic() > deadline:
                raise
        if time.monotonic() > deadline:
            raise TimeoutError(f"not every one of {partitions} partitions was owned within {timeout:g} s")
        time.sleep(0.2)


FILL_CHUNK = 50_000
"""Appends a raw stream sends before it reads its feed: more, and both sides can end up waiting to write (the
stream writes every batch before it reads; the server's feed to it waits for room)."""


def fill(cluster: LocalCluster, address: str, partition: int, count: int) -> float:
    """Append count 512 B transactions to a partition over raw streams; returns appends/s."""
    seconds = 0.0
    for first in range(0, count, FILL_CHUNK):
        hwm = asyncio.run(high_water_mark(address, None, partition))
        seconds += asyncio.run(raw_stream(cluster, hwm, min(FILL_CHUNK, count - first), 0, partition, address))[0]
    return count / seconds


def metric(url: str, name: str, labels: dict[str, str] | None = None) -> float:
    """The sum of a metric's samples (with those labels) from a /metrics page."""
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    total = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in (labels or {}).items()):
                total += sample.value
    return total


def table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A plain text table, columns right-aligned except the first."""
    cells = [[str(h) for h in header]] + [[_cell(v) for v in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = []
    for n, row in enumerate(cells):
        lines.append("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths,
                                                                                                      strict=True))))
        if n == 0:
            lines.append("-" * len(lines[0]))
    return "\n".join(lines)


def _cell(value: object) -> str:
    if isinstance(value, float):
        return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def verdict(ok: bool) -> str:
    return "met" if ok else "MISSED"


def main_for(description: str, run: Callable[[Path, bool], str]) -> Callable[[list[str] | None], int]:
    """The command-line entry of a curve: --quick and --dir, then print what run(workdir, quick) returns."""

    def main(argv: list[str] | None = None) -> int:
        import tempfile

        parser = argparse.ArgumentParser(description=description)
        parser.add_argument("--quick", action="store_true", help="the short form (a smoke run)")
        parser.add_argument("--dir", default=None, help="work directory (default: a temporary one)")
        args = parser.parse_args(argv)
        logging.basicConfig(level=logging.WARNING)
        logging.getLogger("kazoo").setLevel(logging.ERROR)
        with tempfile.TemporaryDirectory(prefix="waltz-curve-", dir=args.dir) as workdir:
            print(run(Path(workdir), args.quick))
        return 0

    return main

