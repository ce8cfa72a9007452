"""Three instances of a web service (bench/web_wallet.py) under a load on hot wallets: does the throughput hold?

    python -m bench.web_service --postgres [--seconds 60] [--instances 3] [--connections 8] [--wallets 4]
        [--sync-helper]

A LocalCluster (3 storage nodes, 1 server, 1 partition), a throwaway PostgreSQL server with a database per
instance, and --instances FastAPI/uvicorn processes of the wallet service (AsyncWaltzClient +
AsyncPostgresClientCallbacks; with --sync-helper the synchronous PostgresClientCallbacks, to compare). A load
generator keeps --connections keep-alive HTTP connections per instance busy for --seconds: 45% deposits, 45%
withdrawals, 10% balance reads, on --wallets hot wallets. Each 5 s window prints:

- requests/s, the ratio to the first window (the baseline, same run), p50 and p99 latency, declined withdrawals;
- the instances' commits and lock failures, their callback threads' busy seconds per second (summed);
- the CPU milliseconds per request of all of the run's processes (instances, cluster, PostgreSQL, this load
  generator) and of each group; the cores they used; `cpu wait`: the cores' worth of time their threads spent
  runnable but waiting for a CPU (the scheduler's run delay, /proc/PID/task/*/schedstat); the cores the machine's
  other processes used; the instances' resident memory;
- the PostgreSQL side: the marks table's and the wallets table's dead rows (pg_stat_user_tables, summed over the
  databases), autovacuum runs, sessions waiting on a lock; and the instances' callback queues.

A throughput that drops while the CPU per request stays flat and `cpu wait` is high is a machine shared with other
work, not a cost that grows. At the end: every database holds the same balances, none negative.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import psycopg

from bench.contention import ROOT, percentile
from waltz_common.testing.local_cluster import LocalCluster, free_port
from waltz_common.testing.postgres import PostgresProcess

WINDOW_S = 5.0
PG_SIDE = ("SELECT relname, n_dead_tup, n_live_tup, autovacuum_count FROM pg_stat_user_tables "
           "WHERE relname IN ('waltz_client_high_water_mark', 'wallets')")


class Http:
    """One keep-alive HTTP/1.1 connection (what a load generator needs of it, no more)."""

    def __init__(self, port: int) -> None:
        self.port = port
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def request(self, method: str, path: str) -> tuple[int, bytes]:
        if self._writer is None:
            self._reader, self._writer = await asyncio.open_connection("127.0.0.1", self.port)
        assert self._reader is not None
        self._writer.write(f"{method} {path} HTTP/1.1\r\nHost: bench\r\nContent-Length: 0\r\n\r\n".encode())
        status_line = await self._reader.readline()
        length = 0
        while (line := await self._reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.decode().partition(":")
            if name.lower() == "content-length":
                length = int(value)
        if not status_line:
            raise ConnectionError("the server closed the connection")
        return int(status_line.split()[1]), await self._reader.readexactly(length)

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()


@dataclass
class Window:
    latencies: list[float] = field(default_factory=list)
    errors: int = 0
    declined: int = 0


async def _load(port: int, wallets: int, deadline: float, start: float, windows: list[Window],
                rng: random.Random) -> None:
    http = Http(port)
    try:
        while (now := time.monotonic()) < deadline:
            wallet, amount, pick = f"w{rng.randrange(wallets)}", rng.randint(1, 10), rng.random()
            path = (f"/deposit/{wallet}/{amount}" if pick < 0.45 else f"/withdraw/{wallet}/{amount}" if pick < 0.9
                    else f"/balance/{wallet}")
            try:
                status, _ = await http.request("GET" if pick >= 0.9 else "POST", path)
            except (OSError, ConnectionError, asyncio.IncompleteReadError):
                status = 0
                http.close()
                http = Http(port)
            done = time.monotonic()
            window = windows[min(len(windows) - 1, int((done - start) // WINDOW_S))]
            if status == 200:
                window.latencies.append(done - now)
            elif status == 409:
                window.latencies.append(done - now)
                window.declined += 1
            else:
                window.errors += 1
    finally:
        http.close()


async def _instance_stats(ports: list[int]) -> list[dict[str, Any]]:
    import json

    stats = []
    for port in ports:
        http = Http(port)
        try:
            stats.append(json.loads((await http.request("GET", "/stats"))[1]))
        finally:
            http.close()
    return stats


async def _pg_side(dsns: list[str]) -> dict[str, int]:
    side = {"marks_dead": 0, "wallets_dead": 0, "autovacuums": 0, "lock_waits": 0}
    for dsn in dsns:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            for relname, dead, _live, vacuums in await (await conn.execute(PG_SIDE)).fetchall():
                side["marks_dead" if relname != "wallets" else "wallets_dead"] += dead
                side["autovacuums"] += vacuums
            row = await (await conn.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                                            "AND datname = current_database()")).fetchone()
            side["lock_waits"] += row[0] if row else 0
    return side


def _cpu_s(pids: list[int]) -> float:
    """CPU seconds so far of these processes."""
    total = 0.0
    for pid in pids:
        try:
            times = psutil.Process(pid).cpu_times()
            total += times.user + times.system
        except psutil.NoSuchProcess:
            pass
    return total


def _run_delay_s(pids: list[int]) -> float:
    """Seconds the threads of these processes have spent runnable but waiting for a CPU (/proc/PID/task/*/schedstat:
    the scheduler's run delay): what tells a process starved of CPU from one that waits on something else."""
    total = 0
    for pid in pids:
        for stat in Path(f"/proc/{pid}/task").glob("*/schedstat"):
            try:
                total += int(stat.read_text().split()[1])
            except (OSError, IndexError, ValueError):
                pass  # a thread that ended meanwhile
    return total / 1e9


def _sample(groups: dict[str, list[int]], pg_pid: int) -> dict[str, float]:
    """CPU seconds so far per group of processes (the PostgreSQL server's backends too), their run delay, and the
    machine's busy seconds (all cores)."""
    found = {name: _cpu_s(pids) for name, pids in groups.items()}
    backends = [c.pid for c in psutil.Process(pg_pid).children()]
    found["database"] = _cpu_s(backends)
    found["rss"] = sum(psutil.Process(pid).memory_info().rss for pid in groups["instances"])
    found["run_delay"] = _run_delay_s([pid for pids in groups.values() for pid in pids] + backends)
    machine = psutil.cpu_times()
    found["machine"] = machine.user + machine.system + machine.nice + machine.irq + machine.softirq
    return found


COUNTERS = ("waltz_client_commits", "waltz_client_lock_failures", "callback_busy_s")


async def _run(ports: list[int], dsns: list[str], args: argparse.Namespace, groups: dict[str, list[int]],
               pg_pid: int) -> list[tuple[Window, dict[str, Any]]]:
    count = int(args.seconds // WINDOW_S)
    windows = [Window() for _ in range(count)]
    start = time.monotonic()
    deadline = start + count * WINDOW_S
    rng = random.Random(args.seed)
    loads = [asyncio.create_task(_load(port, args.wallets, deadline, start, windows, random.Random(rng.random())))
             for port in ports for _ in range(args.connections)]
    sides: list[dict[str, Any]] = []
    before: dict[str, Any] = {**dict.fromkeys(COUNTERS, 0), **_sample(groups, pg_pid)}
    print(f"{'window':>8} {'req/s':>7} {'ratio':>6} {'p50 ms':>7} {'p99 ms':>7} {'declined':>8} {'errors':>6} "
          f"{'commits':>7} {'lockfail':>8} {'cb busy':>7} {'ms cpu/req':>10} {'app':>5} {'cluster':>7} {'db':>5} "
          f"{'our cores':>9} {'cpu wait':>8} {'others':>6} {'app MB':>6} {'marks dead':>10} {'wallets dead':>12} "
          f"{'autovac':>7} {'lock waits':>10} {'cb queues':>10}", flush=True)
    for index in range(count):
        await asyncio.sleep(max(0.0, start + (index + 1) * WINDOW_S - time.monotonic()))
        side: dict[str, Any] = {**await _pg_side(dsns), **_sample(groups, pg_pid)}
        stats = await _instance_stats(ports)
        side["queues"] = "/".join(str(s["callback_queue"]) for s in stats)
        for key in COUNTERS:
            side[key] = sum(s[key] for s in stats)
        await asyncio.sleep(0.2)  # the window's last answers are counted
        w = windows[index]
        rate = len(w.latencies) / WINDOW_S
        base = len(windows[0].latencies) / WINDOW_S or 1.0
        delta = {key: side[key] - before[key] for key in (*COUNTERS, *groups, "database", "machine", "run_delay")}
        ours = sum(delta[key] for key in (*groups, "database"))
        per_request = 1000 / max(1, len(w.latencies))  # ms per request of a second's CPU
        print(f"{index * WINDOW_S:>4.0f}-{(index + 1) * WINDOW_S:<3.0f} {rate:>7.1f} {rate / base:>6.2f} "
              f"{percentile(w.latencies, 0.5) * 1000:>7.1f} {percentile(w.latencies, 0.99) * 1000:>7.1f} "
              f"{w.declined:>8} {w.errors:>6} {delta['waltz_client_commits']:>7} "
              f"{delta['waltz_client_lock_failures']:>8} {delta['callback_busy_s'] / WINDOW_S:>7.2f} "
              f"{ours * per_request:>10.2f} {delta['instances'] * per_request:>5.2f} "
              f"{delta['cluster'] * per_request:>7.2f} {delta['database'] * per_request:>5.2f} "
              f"{ours / WINDOW_S:>9.2f} {delta['run_delay'] / WINDOW_S:>8.2f} "
              f"{(delta['machine'] - ours) / WINDOW_S:>6.2f} {side['rss'] / 2**20:>6.0f} "
              f"{side['marks_dead']:>10} {side['wallets_dead']:>12} "
              f"{side['autovacuums']:>7} {side['lock_waits']:>10} {side['queues']:>10}", flush=True)
        sides.append({"ms_per_request": ours * per_request, "our_cores": ours / WINDOW_S})
        before = side
    await asyncio.gather(*loads)
    return list(zip(windows, sides, strict=True))


def _balances(dsn: str) -> list[tuple[str, int]]:
    with psycopg.connect(dsn) as conn:
        return [(w, int(b)) for w, b in conn.execute("SELECT wallet, balance FROM wallets ORDER BY wallet")]


def _wait_applied(ports: list[int]) -> None:
    """Until every instance has applied the same log (the load has stopped): their databases can be compared."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        marks = {s["client_high_water_mark"] for s in asyncio.run(_instance_stats(ports))}
        if len(marks) == 1:
            return
        time.sleep(0.2)


def _wait_ready(ports: list[int], processes: list[subprocess.Popen[bytes]], workdir: Path) -> None:
    deadline = time.monotonic() + 120
    pending = set(ports)
    while pending:
        if time.monotonic() > deadline or any(p.poll() is not None for p in processes):
            raise RuntimeError(f"an instance did not start: see {workdir}/instance-*.log")
        for port in list(pending):
            try:
                asyncio.run(_instance_stats([port]))
                pending.discard(port)
            except (OSError, ValueError):
                pass
        time.sleep(0.2)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--postgres", action="store_true", required=True,
                        help="the instances apply into PostgreSQL with AsyncPostgresClientCallbacks (the only mode)")
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--instances", type=int, default=3)
    parser.add_argument("--connections", type=int, default=8, help="concurrent HTTP connections per instance")
    parser.add_argument("--wallets", type=int, default=4, help="hot wallets")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--sync-helper", action="store_true",
                        help="the instances use the synchronous PostgresClientCallbacks instead, to compare")
    parser.add_argument("--workdir", help="keep the cluster's and the instances' files here")
    args = parser.parse_args(argv)
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="waltz-web-service-"))
    workdir.mkdir(parents=True, exist_ok=True)
    with PostgresProcess() as pg, LocalCluster(workdir / "cluster", cluster_root="/bench/web_service") as cluster:
        config = cluster.write_client_config("client.yaml")
        dsns = []
        with psycopg.connect(pg.dsn(), autocommit=True) as admin:
            for index in range(args.instances):
                admin.execute(f"CREATE DATABASE wallet{index}")
                dsns.append(pg.dsn(f"wallet{index}"))
        ports = [free_port() for _ in range(args.instances)]
        processes = []
        try:
            for index, (port, dsn) in enumerate(zip(ports, dsns, strict=True)):
                log = (workdir / f"instance-{index}.log").open("w")
                command = [sys.executable, "-m", "bench.web_wallet", "--config", str(config), "--dsn", dsn,
                           "--port", str(port), *(["--sync-helper"] if args.sync_helper else [])]
                processes.append(subprocess.Popen(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT))
            _wait_ready(ports, processes, workdir)
            print(f"{'PostgresClientCallbacks' if args.sync_helper else 'AsyncPostgresClientCallbacks'}: "
                  f"{args.instances} instances, {args.connections} connections each, {args.wallets} hot wallets, "
                  f"{args.seconds:.0f} s; ratio: to the first window", flush=True)
            groups = {"instances": [p.pid for p in processes], "cluster": list(cluster.pids().values()),
                      "bench": [os.getpid()]}
            results = asyncio.run(_run(ports, dsns, args, groups, pg.pid or 0))
            _wait_applied(ports)
            balances = [_balances(dsn) for dsn in dsns]
        finally:
            for process in processes:
                process.terminate()
            for process in processes:
                try:
                    process.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
    rates = [len(w.latencies) / WINDOW_S for w, _ in results]
    costs = [side["ms_per_request"] for _, side in results]
    print(f"requests/s: first window {rates[0]:.1f}, last {rates[-1]:.1f}, lowest {min(rates):.1f} "
          f"(lowest/first {min(rates) / (rates[0] or 1):.2f}); CPU ms per request (all of ours: instances, cluster, "
          f"PostgreSQL, load): first {costs[0]:.2f}, last {costs[-1]:.2f}, highest {max(costs):.2f} "
          f"(highest/first {max(costs) / (costs[0] or 1):.2f})")
    print(f"errors {sum(w.errors for w, _ in results)}; "
          f"databases identical: {all(b == balances[0] for b in balances)}; "
          f"negative balances: {sum(1 for _, b in balances[0] if b < 0)}")


if __name__ == "__main__":
    main()
