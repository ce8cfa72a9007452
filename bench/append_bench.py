"""Append and feed throughput, commit latency and memory over a real local cluster, next to baselines in the same run.

    .venv/bin/python -m bench.append_bench [--quick] [--dir DIR] [--procs P] [--server K=V] [--client K=V]
    .venv/bin/python -m bench.append_bench --baseline 56f6eac [--rounds 2] [the options above]

With --baseline, the same benchmark of a named git revision runs in the same run (its own checkout and
virtualenv, bench/revisions.py), the two alternating, and every row is printed with its ratio.

Baselines first, on the same machine and in the same run:
- raw gRPC: a bidi stream echoing 512 B messages from another process, one at a time (the
  round-trip floor of one hop) and 100 in flight (the message ceiling);
- the storage node alone (one `waltz-storage`, no server): one 1-record append at a time, and
  pipelined appends of 100 records (as bench/storage_bench.py).
Then a LocalCluster (ZooKeeper, 3 storage nodes, 1 server, 1 partition), 512 B transactions:
- prefill: bulk appends over one raw client stream (AppendBatches of 1000), which fills the
  server's caches so that its memory has reached its bound before the measured phases;
- feed: the whole log from transaction 0 to one consumer: a raw Stream (mount at -1, counting
  FeedData) and an AsyncWaltzClient applying every transaction;
- closed loop: N writers (1, 10, 100), each submitting one append through AsyncWaltzClient and
  waiting for its commit, again and again; writer processes each run one client. Their callbacks
  never block, so they run on the client's event loop (client.callbackThread=false, WRITER_CLIENT);
  `--client client.callbackThread=true` measures them on the callback thread instead;
- open loop: 1,000 appends/s offered on a fixed schedule (latency counted from the scheduled
  time, so a stall is not hidden);
- peak RSS of every process, and the server's RSS over the 100-writer run.
Prints a table with the targets next to the numbers; asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import yaml
from prometheus_client.parser import text_string_to_metric_families

from bench import revisions
from bench.append_writers import PARTITION, CountingCallbacks, Job, JobResult, run_clients
from bench.baselines import Baselines, MemorySampler, cpu_seconds, percentile, run_baselines
from bench.raw_client import PREFILL_BATCH, high_water_mark, raw_stream
from waltz_client import AsyncWaltzClient
from waltz_common.testing.local_cluster import LocalCluster
from waltz_common.testing.zookeeper import ZooKeeperProcess

OPEN_LOOP_RATE = 1000.0
WRITERS = (1, 10, 100)

# targets from issue 4
TARGET_APPENDS = 20_000.0
TARGET_P99_S = 0.020
TARGET_FEED = 100_000.0


@dataclass(frozen=True)
class Scale:
    prefill: int
    warmup_s: float
    run_s: float
    long_run_s: float
    open_run_s: float
    echo_serial: int
    echo_pipelined: int
    storage_serial: int
    storage_batches: int


FULL = Scale(300_000, 2.0, 10.0, 40.0, 15.0, 2000, 40_000, 2000, 1000)
QUICK = Scale(150_000, 1.0, 4.0, 10.0, 5.0, 500, 10_000, 500, 300)


# ---------------------------------------------------------------------------------------- client processes


@dataclass
class WriterRow:
    label: str
    processes: int
    rate: float
    p50: float
    p99: float
    errors: int
    cpu: dict[str, float]  # CPU seconds per 1000 committed appends, by process group
    offered: float = 0.0
    batch: float = 0.0  # appends per store batch (server metric) over the measured window


@dataclass
class Report:
    load: list[tuple[str, tuple[float, float, float]]] = field(default_factory=list)
    baselines: Baselines | None = None
    prefill_rate: float = 0.0
    prefill_count: int = 0
    feed_raw: float = 0.0
    feed_client: float = 0.0
    feed_count: int = 0
    writers: list[WriterRow] = field(default_factory=list)
    memory_timeline: list[tuple[float, int, int]] = field(default_factory=list)  # (seconds, hwm, server rss)
    server_rss_after_prefill: int = 0
    peak: dict[str, int] = field(default_factory=dict)
    log_size: int = 0


class Window:
    """Run in the parent while client processes measure: the cluster's CPU over their window, and
    (when timeline is given) the log size and server RSS at ten points of it."""

    def __init__(self, cluster: LocalCluster, sampler: MemorySampler, scale: Scale, seconds: float,
                 timeline: list[tuple[float, int, int]] | None = None) -> None:
        self._processes = {name: psutil.Process(pid) for name, pid in cluster.pids().items()}
        self._address = cluster.servers[0].address
        self._tls = cluster.tls_files("application")
        self._metrics_url = f"http://127.0.0.1:{cluster.servers[0].metrics_port}/metrics"
        self._sampler = sampler
        self._warmup = scale.warmup_s
        self._seconds = seconds
        self._timeline = timeline
        self.cpu: dict[str, float] = {}
        self.batch = 0.0

    def _batches(self) -> tuple[float, float]:
        """(appends, store batches) so far, from the server's waltz_server_store_batch_appends histogram."""
        with urllib.request.urlopen(self._metrics_url, timeout=10) as response:
            text = response.read().decode()
        total = count = 0.0
        for family in text_string_to_metric_families(text):
            if family.name == "waltz_server_store_batch_appends":
                for sample in family.samples:
                    if sample.name.endswith("_sum"):
                        total += sample.value
                    elif sample.name.endswith("_count"):
                        count += sample.value
        return total, count

    def _cpu(self) -> dict[str, float]:
        return cpu_seconds(self._processes)

    def __call__(self) -> None:
        started = time.perf_counter()
        time.sleep(self._warmup)
        before = self._cpu()
        batches_before = self._batches()
        for i in range(1, 11):
            time.sleep(max(0.0, started + self._warmup + self._seconds * i / 10 - time.perf_counter()))
            if self._timeline is not None:
                hwm = asyncio.run(high_water_mark(self._address, self._tls))
                self._timeline.append((time.perf_counter() - started, hwm, self._sampler.rss("server-0")))
        after = self._cpu()
        batches_after = self._batches()
        self.cpu = {name: after[name] - before[name] for name in after}
        appends, batches = (a - b for a, b in zip(batches_after, batches_before, strict=True))
        self.batch = appends / batches if batches else 0.0


def _cpu_per_1000(window: Window, results: list[JobResult], committed: int) -> dict[str, float]:
    per = 1000 / max(committed, 1)
    cpu = window.cpu
    return {
        "server": cpu.get("server-0", 0.0) * per,
        "storage": sum(v for k, v in cpu.items() if k.startswith("storage")) * per,
        "clients": sum(r.cpu_s for r in results) * per,
        "zookeeper": cpu.get("zookeeper", 0.0) * per,
    }


WRITER_CLIENT: dict[str, object] = {"client.callbackThread": False}
"""Client keys of the writer processes: an application whose callbacks never block runs them on the loop."""


def closed_loop(cluster: LocalCluster, writers: int, procs: int, seconds: float, scale: Scale,
                sampler: MemorySampler, timeline: list[tuple[float, int, int]] | None = None,
                client: dict[str, object] | None = None) -> WriterRow:
    hwm = asyncio.run(high_water_mark(cluster.servers[0].address, cluster.tls_files("application")))
    share = [writers // procs + (1 if i < writers % procs else 0) for i in range(procs)]
    config = cluster.client_config(**(WRITER_CLIENT if client is None else client))
    jobs = [Job(config, hwm, writers=n, warmup_s=scale.warmup_s, run_s=seconds) for n in share if n]
    window = Window(cluster, sampler, scale, seconds, timeline)
    results = run_clients(jobs, sampler, window)
    latencies = [x for r in results for x in r.latencies]
    committed = sum(r.committed for r in results)
    return WriterRow(f"{writers} writers", len(jobs), committed / seconds, percentile(latencies, 0.5),
                     percentile(latencies, 0.99), sum(r.errors for r in results),
                     _cpu_per_1000(window, results, committed), batch=window.batch)


def open_loop(cluster: LocalCluster, scale: Scale, sampler: MemorySampler,
              client: dict[str, object] | None = None) -> WriterRow:
    hwm = asyncio.run(high_water_mark(cluster.servers[0].address, cluster.tls_files("application")))
    config = cluster.client_config(**(WRITER_CLIENT if client is None else client))
    job = Job(config, hwm, rate=OPEN_LOOP_RATE, warmup_s=scale.warmup_s, run_s=scale.open_run_s)
    window = Window(cluster, sampler, scale, scale.open_run_s)
    (result,) = run_clients([job], sampler, window)
    latencies = list(result.latencies)
    return WriterRow(f"open loop {OPEN_LOOP_RATE:,.0f}/s", 1, result.committed / scale.open_run_s,
                     percentile(latencies, 0.5), percentile(latencies, 0.99), result.errors,
                     _cpu_per_1000(window, [result], result.committed), OPEN_LOOP_RATE, window.batch)


async def client_feed(cluster: LocalCluster, until: int, cpu: list[float] | None = None) -> float:
    """Seconds for an AsyncWaltzClient mounting at -1 to apply every transaction up to `until` (cpu: gets this
    process's CPU seconds over the same time, from the mount: bench.feed_row)."""
    callbacks = CountingCallbacks(-1)
    config = cluster.client_config(**{"client.autoMount": False})
    loop = asyncio.get_running_loop()
    done = asyncio.Event()

    def applied(hwm: int) -> None:
        if hwm >= until:
            loop.call_soon_threadsafe(done.set)

    callbacks.on_apply = applied
    async with AsyncWaltzClient(callbacks, config) as client:
        started, process = time.perf_counter(), time.process_time()
        client.mount_partitions([PARTITION])
        await done.wait()
        if cpu is not None:
            cpu.append(time.process_time() - process)
        return time.perf_counter() - started


def run(workdir: Path, scale: Scale, procs: int, server_overrides: dict[str, object] | None = None,
        client: dict[str, object] | None = None) -> Report:
    report = Report()
    with ZooKeeperProcess(workdir / "zookeeper") as zookeeper, MemorySampler() as sampler:
        assert zookeeper.pid is not None
        sampler.watch("zookeeper", zookeeper.pid)
        sampler.watch("benchmark (this process)", os.getpid())

        def load(label: str) -> None:
            report.load.append((label, os.getloadavg()))

        load("start")
        report.baselines = run_baselines(
            workdir, zookeeper.connect_string, sampler, echo_serial=scale.echo_serial,
            echo_pipelined=scale.echo_pipelined, storage_serial=scale.storage_serial,
            storage_batches=scale.storage_batches,
        )
        with LocalCluster(workdir / "cluster", storage_nodes=3, servers=1, partitions=1,
                          zookeeper=zookeeper.connect_string, cluster_root="/bench/append",
                          server_overrides=server_overrides) as cluster:
            for name, pid in cluster.pids().items():
                if name != "zookeeper":
                    sampler.watch(name, pid)
            address = cluster.servers[0].address

            seconds, _ = asyncio.run(raw_stream(cluster, -1, scale.prefill, 0))
            report.prefill_count, report.prefill_rate = scale.prefill, scale.prefill / seconds
            report.server_rss_after_prefill = sampler.rss("server-0")

            hwm = asyncio.run(high_water_mark(address))
            seconds, seen = asyncio.run(raw_stream(cluster, -1, 0, hwm))
            report.feed_count, report.feed_raw = seen, seen / seconds
            report.feed_client = (hwm + 1) / asyncio.run(client_feed(cluster, hwm))
            load("after prefill and feed")

            for writers in WRITERS:
                if writers < 100:
                    row = closed_loop(cluster, writers, 1, scale.run_s, scale, sampler, client=client)
                else:  # the long run, watching the server's memory
                    row = closed_loop(cluster, writers, procs, scale.long_run_s, scale, sampler,
                                      report.memory_timeline, client)
                report.writers.append(row)
                load(f"after {writers} writers")
            report.writers.append(open_loop(cluster, scale, sampler, client))
            load("after open loop")
            report.log_size = asyncio.run(high_water_mark(address)) + 1
        report.peak = dict(sampler.peak)
    return report


# ---------------------------------------------------------------------------------------- table


def _mib(n: int) -> str:
    return f"{n / 2**20:,.0f} MiB"


def _ms(s: float) -> str:
    return f"{s * 1000:.2f}"


def _verdict(ok: bool) -> str:
    return "met" if ok else "MISSED"


def format_report(report: Report, procs: int) -> str:
    b = report.baselines
    assert b is not None
    lines = ["load average (1, 5, 15 min): " + "; ".join(
        f"{label} {a:.2f} {b5:.2f} {c:.2f}" for label, (a, b5, c) in report.load)]
    lines += ["", "baselines (same run)"]
    head = f"{'':<44} {'per second':>12} {'p50 ms':>8} {'p99 ms':>8}"
    lines += [head, "-" * len(head)]

    def baseline(label: str, rate: float, latencies: list[float] | None = None) -> None:
        p50, p99 = (_ms(percentile(latencies, q)) for q in (0.5, 0.99)) if latencies else ("", "")
        lines.append(f"{label:<44} {rate:>12,.0f} {p50:>8} {p99:>8}")

    baseline("raw gRPC echo, 512 B, one at a time", len(b.echo_latencies) / sum(b.echo_latencies), b.echo_latencies)
    baseline("raw gRPC echo, 512 B, 100 in flight (msgs)", b.echo_rate)
    baseline("storage alone, 1-record append at a time", len(b.storage_latencies) / sum(b.storage_latencies),
             b.storage_latencies)
    baseline("storage alone, 100-record appends (records)", b.storage_records_rate)

    lines += ["", "cluster: 3 storage replicas, 1 server, 1 partition, 512 B transactions"]
    head = (f"{'':<30} {'procs':>5} {'per second':>12} {'p50 ms':>8} {'p99 ms':>8} {'errors':>6} | "
            f"{'x echo msgs/s':>13} {'x storage recs/s':>16} | target")
    lines += [head, "-" * len(head)]

    def row(label: str, procs_: str, rate: float, p50: str, p99: str, errors: str, target: str) -> None:
        lines.append(f"{label:<30} {procs_:>5} {rate:>12,.0f} {p50:>8} {p99:>8} {errors:>6} | "
                     f"{rate / b.echo_rate:>13.2f} {rate / b.storage_records_rate:>16.2f} | {target}")

    row(f"prefill: raw AppendBatch x{PREFILL_BATCH}", "1", report.prefill_rate, "", "", "", "")
    row("feed from 0: raw Stream", "1", report.feed_raw, "", "", "",
        f">= {TARGET_FEED:,.0f}/s: {_verdict(report.feed_raw >= TARGET_FEED)}")
    row("feed from 0: AsyncWaltzClient", "1", report.feed_client, "", "", "",
        f">= {TARGET_FEED:,.0f}/s: {_verdict(report.feed_client >= TARGET_FEED)}")
    for w in report.writers:
        target = ""
        if w.label == "100 writers":
            target = f">= {TARGET_APPENDS:,.0f}/s: {_verdict(w.rate >= TARGET_APPENDS)}"
        elif w.offered:
            target = f"p99 <= {TARGET_P99_S * 1000:.0f} ms: {_verdict(w.p99 <= TARGET_P99_S)}"
        row(f"{w.label}, committed", str(w.processes), w.rate, _ms(w.p50), _ms(w.p99), str(w.errors), target)
    lines.append(f"feed: the log held {report.feed_count:,} transactions (the server caches the newest 100,000; "
                 "older ones come from storage). Latency: submit to the commit seen by the writer's client "
                 "(open loop: from the scheduled time).")
    one = next(w for w in report.writers if w.label == "1 writers")
    lines.append(f"1 writer p50 / storage-alone 1-record p50: {one.p50 / percentile(b.storage_latencies, 0.5):.1f}x; "
                 f"/ raw gRPC echo p50: {one.p50 / percentile(b.echo_latencies, 0.5):.1f}x")

    lines += ["", "CPU seconds per 1,000 committed appends, over the measured window (all 3 storage nodes summed)"]
    head = (f"{'':<36} {'server':>7} {'storage':>7} {'clients':>7} {'zk':>5} {'total':>6} | "
            f"{'2 cores / total':>15} | {'appends/batch':>13}")
    lines += [head, "-" * len(head)]
    for w in report.writers:
        total = sum(w.cpu.values())
        lines.append(f"{w.label:<36} {w.cpu['server']:>7.3f} {w.cpu['storage']:>7.3f} {w.cpu['clients']:>7.3f} "
                     f"{w.cpu['zookeeper']:>5.2f} {total:>6.3f} | {2000 / total if total else 0:>13,.0f}/s | "
                     f"{w.batch:>13.1f}")
    lines.append("2 cores / total: the appends/s at which this cluster and its clients would fill both cores. "
                 "appends/batch: the mean store batch (one storage request per replica), from the server's metrics.")

    lines += ["", "memory (peak RSS, sampled every 0.2 s)"]
    for name, peak in sorted(report.peak.items()):
        lines.append(f"  {name:<28} {_mib(peak):>10}")
    lines.append(f"  server RSS after the prefill of {report.prefill_count:,}: "
                 f"{_mib(report.server_rss_after_prefill)}; over the 100-writer run (seconds, log size, RSS):")
    lines.append("    " + "; ".join(f"{t:.0f} s {hwm + 1:,} {_mib(rss)}" for t, hwm, rss in report.memory_timeline))
    if len(report.memory_timeline) >= 2:
        first, last = report.memory_timeline[0], report.memory_timeline[-1]
        growth = (last[2] - first[2]) / 2**20
        lines.append(f"  server: {growth:+.1f} MiB from {first[1] + 1:,} to {last[1] + 1:,} transactions "
                     f"(target: bounded, no growth with run length: {_verdict(abs(growth) < 32)})")
    lines.append(f"  log size at the end: {report.log_size:,} transactions; 100 writers ran in {procs} process(es)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench.append_bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="short phases (about a minute and a half in all)")
    parser.add_argument("--dir", default=None, help="work directory (default: a temporary one); sets the disk")
    parser.add_argument("--procs", type=int, default=1,
                        help="client processes for the 100 writers (each gets the whole feed; one was fastest here)")
    parser.add_argument("--server", action="append", default=[], metavar="KEY=VALUE",
                        help="a server configuration key (repeatable), e.g. storage.maxBatchesInFlight=1")
    parser.add_argument("--client", action="append", default=[], metavar="KEY=VALUE",
                        help="a client configuration key of the writer processes (repeatable), on top of "
                             f"{', '.join(f'{k}={v}' for k, v in WRITER_CLIENT.items())}")
    parser.add_argument("--baseline", metavar="REV",
                        help="also run the benchmark of this git revision (e.g. 56f6eac), in its own checkout and "
                             "virtualenv under $WALTZ_BENCH_CACHE (default ~/.cache/waltz-bench), and print the "
                             "ratio of every row")
    parser.add_argument("--candidate", metavar="REV",
                        help="with --baseline: compare with this git revision (its own checkout, as the baseline's) "
                             "instead of this checkout, e.g. to bisect")
    parser.add_argument("--rounds", type=int, default=1,
                        help="with --baseline: runs of each revision, alternating which goes first (default 1)")
    args = parser.parse_args(argv)
    if args.baseline:
        return compare_with(args.baseline, args.rounds, _passed_on(args), args.candidate)
    overrides = _keys(args.server)
    client = {**WRITER_CLIENT, **_keys(args.client)}
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("kazoo").setLevel(logging.ERROR)
    scale = QUICK if args.quick else FULL
    with tempfile.TemporaryDirectory(prefix="waltz-append-bench-", dir=args.dir) as workdir:
        report = run(Path(workdir), scale, args.procs, overrides, client)
        print(format_report(report, args.procs))
        if overrides:
            print("server configuration: " + ", ".join(f"{k}={v}" for k, v in overrides.items()))
        print("writer client configuration: " + ", ".join(f"{k}={v}" for k, v in client.items()))
    return 0


def _passed_on(args: argparse.Namespace) -> list[str]:
    """The options both revisions' runs get."""
    passed = ["--procs", str(args.procs)] + (["--quick"] if args.quick else [])
    if args.dir:
        passed += ["--dir", args.dir]
    for key in args.server:
        passed += ["--server", key]
    for key in args.client:
        passed += ["--client", key]
    return passed


def compare_with(revision: str, rounds: int, passed: list[str], candidate: str | None = None) -> int:
    """Run this checkout's benchmark (or the candidate revision's) and the baseline revision's, alternating,
    `rounds` times each; print both tables of every run and then every row side by side with its ratio."""
    base = revisions.checkout(revision)
    if candidate is None:
        here, python, name = revisions.REPO, Path(sys.executable), f"this checkout ({_head(revisions.REPO)})"
    else:
        other = revisions.checkout(candidate)
        here, python, name = other.path, other.python, f"{candidate} ({other.commit[:12]})"
    sides = {"baseline": (base.path, base.python), "candidate": (here, python)}
    parsed: dict[str, list[revisions.Rows]] = {"baseline": [], "candidate": []}
    timeout = 900.0 if "--quick" in passed else 2400.0
    for round_ in range(rounds):
        order = ("baseline", "candidate") if round_ % 2 == 0 else ("candidate", "baseline")
        for side in order:
            cwd, python = sides[side]
            print(f"== round {round_ + 1}, {side}: {cwd} ({python})", file=sys.stderr, flush=True)
            table = revisions.run_bench(cwd, python, passed, timeout)
            print(f"== round {round_ + 1}, {side} ({revision if side == 'baseline' else name})\n{table}", flush=True)
            parsed[side].append(revisions.parse(table))
    print(f"== {rounds} round(s): baseline {revision} ({base.commit[:12]}) vs {name}, options: {' '.join(passed)}")
    print(revisions.compare(parsed["baseline"], parsed["candidate"], f"baseline {revision}",
                            "this checkout" if candidate is None else candidate))
    return 0


def _head(repo: Path) -> str:
    """This checkout's commit, with '+changes' when its tracked files differ from it."""
    commit = subprocess.run(["git", "-C", str(repo), "rev-parse", "--short=12", "HEAD"], capture_output=True,
                            text=True, check=False).stdout.strip() or "unknown"
    dirty = subprocess.run(["git", "-C", str(repo), "diff", "--quiet", "HEAD"], check=False).returncode
    return commit + ("+changes" if dirty else "")


def _keys(options: list[str]) -> dict[str, object]:
    """KEY=VALUE options as configuration keys (values parsed as YAML scalars)."""
    keys: dict[str, object] = {}
    for option in options:
        key, _, value = option.partition("=")
        keys[key] = yaml.safe_load(value)
    return keys


if __name__ == "__main__":
    raise SystemExit(main())
