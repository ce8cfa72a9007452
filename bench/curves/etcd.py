"""Waltz next to etcd on the same machine, in the same run: N closed-loop writers of 512 B values.

    .venv/bin/python -m bench.curves.etcd [--quick]

etcd: a 3-member cluster of Debian's etcd-server (3.4) on loopback, started here in the work directory and
stopped by pid, under etcd's own load: Debian does not ship etcd's tools/benchmark, so bench/etcd_load (its
`benchmark put` loop: N clients over C connections, each putting and waiting, again and again) is built from
Debian's etcd client library (golang-etcd-server-dev) with Debian's Go. The full run adds `etcdctl check perf
--load=xl` (etcd's built-in check: 1,000 clients, 1 KiB values, at most 15,000 puts/s, 60 s).
Waltz: a LocalCluster (3 storage replicas, 1 server, 1 partition) under the same N writers (one
AsyncWaltzClient process). The ratio is Waltz's committed appends/s over etcd's puts/s.

Needs: apt-get install etcd-server etcd-client golang-go golang-etcd-server-dev
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import threading
import time
from pathlib import Path

from bench.append_bench import WRITER_CLIENT
from bench.append_writers import Job, run_clients
from bench.baselines import MemorySampler, percentile
from bench.curves.common import CpuWindow, LoadLog, main_for, table, verdict, wait_owned
from waltz_common.testing.local_cluster import LocalCluster, free_port
from waltz_common.testing.zookeeper import ZooKeeperProcess

WRITERS = 100
CONNECTIONS = 10
TARGET_RATIO = 3.0  # Waltz at least 3x etcd's writes/s (issue 20)
GOPATH = "/usr/share/gocode"
SOURCE = Path(__file__).resolve().parents[1] / "etcd_load"
PACKAGES = "etcd-server etcd-client golang-go golang-etcd-server-dev"


def _need(program: str) -> str:
    found = shutil.which(program)
    if found is None:
        raise RuntimeError(f"{program} not found: apt-get install {PACKAGES}")
    return found


def build_load(workdir: Path) -> Path:
    """Build bench/etcd_load against Debian's etcd client library; returns the binary."""
    out = workdir / "etcd_load"
    env = {**os.environ, "GO111MODULE": "off", "GOPATH": GOPATH, "GOFLAGS": ""}
    done = subprocess.run([_need("go"), "build", "-o", str(out), "."], cwd=SOURCE, env=env, capture_output=True,
                          text=True, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"building bench/etcd_load failed (apt-get install {PACKAGES}):\n{done.stderr[-2000:]}")
    return out


class EtcdCluster:
    """Three etcd members on loopback in a work directory; stopped (by pid) on exit."""

    def __init__(self, workdir: Path, members: int = 3) -> None:
        self.workdir = workdir
        self.ports = [(free_port(), free_port()) for _ in range(members)]
        self.processes: list[subprocess.Popen[bytes]] = []

    @property
    def endpoints(self) -> str:
        return ",".join(f"127.0.0.1:{client}" for client, _ in self.ports)

    def __enter__(self) -> EtcdCluster:
        etcd = _need("etcd")
        initial = ",".join(f"m{i}=http://127.0.0.1:{peer}" for i, (_, peer) in enumerate(self.ports))
        try:
            for i, (client, peer) in enumerate(self.ports):
                data = self.workdir / f"m{i}"
                data.mkdir(parents=True)
                log = (self.workdir / f"m{i}.log").open("wb")
                self.processes.append(subprocess.Popen([
                    etcd, "--name", f"m{i}", "--data-dir", str(data),
                    "--listen-client-urls", f"http://127.0.0.1:{client}",
                    "--advertise-client-urls", f"http://127.0.0.1:{client}",
                    "--listen-peer-urls", f"http://127.0.0.1:{peer}",
                    "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
                    "--initial-cluster", initial, "--initial-cluster-state", "new",
                    "--initial-cluster-token", "waltz-bench", "--logger", "zap", "--log-level", "warn",
                ], stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL))
                log.close()
            self._wait_healthy()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_healthy(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            done = subprocess.run([_need("etcdctl"), "--endpoints", self.endpoints, "endpoint", "health"],
                                  capture_output=True, text=True, env={**os.environ, "ETCDCTL_API": "3"})
            if done.returncode == 0:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"etcd not healthy within {timeout:g} s: {done.stderr[-1000:]}")
            time.sleep(0.3)

    def pids(self) -> dict[str, int]:
        return {f"etcd-{i}": p.pid for i, p in enumerate(self.processes)}

    def stop(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.terminate()
        for process in self.processes:
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=15)

    def __exit__(self, *exc: object) -> None:
        self.stop()


def etcd_load(binary: Path, endpoints: str, warmup: float, seconds: float) -> dict[str, float]:
    command = [str(binary), "--endpoints", endpoints, "--clients", str(WRITERS), "--conns", str(CONNECTIONS),
               "--val-size", "512", "--warmup", f"{warmup}s", "--duration", f"{seconds}s"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=warmup + seconds + 120)
    if done.returncode != 0:
        raise RuntimeError(f"etcd_load failed: {done.stderr[-2000:]}")
    words = done.stdout.split()
    return {words[i]: float(words[i + 1]) for i in range(0, len(words) - 1, 2)}


def check_perf(endpoints: str) -> float:
    """etcdctl check perf --load=xl: the writes/s it reports."""
    done = subprocess.run([_need("etcdctl"), "--endpoints", endpoints, "check", "perf", "--load=xl"],
                          capture_output=True, text=True, timeout=300, env={**os.environ, "ETCDCTL_API": "3"})
    match = re.search(r"Throughput is (\d+) writes/s|Throughput too low: (\d+) writes/s", done.stdout)
    if match is None:
        raise RuntimeError(f"etcdctl check perf: no throughput in {done.stdout[-1000:]} {done.stderr[-1000:]}")
    return float(match.group(1) or match.group(2))


def run(workdir: Path, quick: bool) -> str:
    warmup, seconds = (1.0, 3.0) if quick else (2.0, 15.0)
    load = LoadLog()
    load.mark("start")
    binary = build_load(workdir)
    rows: list[list[object]] = []
    with EtcdCluster(workdir / "etcd") as etcd:
        window = CpuWindow(etcd.pids(), warmup, seconds)
        meter = threading.Thread(target=window)
        meter.start()
        result = etcd_load(binary, etcd.endpoints, warmup, seconds)
        meter.join()
        etcd_rate = result["rate"]
        cpu = sum(window.cpu.values()) * 1000 / max(result["puts"], 1)
        rows.append([f"etcd 3.4, 3 members: {WRITERS} clients over {CONNECTIONS} connections (baseline)", etcd_rate,
                     1.0, result["p50"], result["p99"], cpu, ""])
        load.mark("etcd")
        if not quick:
            rows.append(["etcd: etcdctl check perf --load=xl (1,000 clients, 1 KiB, 60 s)", check_perf(etcd.endpoints),
                         "", "", "", "", ""])
            load.mark("etcd check perf")
    with ZooKeeperProcess(workdir / "zookeeper") as zookeeper, MemorySampler() as sampler:
        with LocalCluster(workdir / "waltz", zookeeper=zookeeper.connect_string, cluster_root="/bench/etcd") as cluster:
            wait_owned(cluster, 1)
            job = Job(cluster.client_config(**WRITER_CLIENT), -1, writers=WRITERS, warmup_s=warmup, run_s=seconds)
            pids = {k: v for k, v in cluster.pids().items() if k != "zookeeper"}
            waltz_window = CpuWindow(pids, warmup, seconds)
            (waltz,) = run_clients([job], sampler, waltz_window)
        rate = waltz.committed / seconds
        latencies = list(waltz.latencies)
        cpu = sum(waltz_window.cpu.values()) * 1000 / max(waltz.committed, 1)
        rows.append([f"Waltz: {WRITERS} writers, 1 client process", rate, rate / etcd_rate,
                     percentile(latencies, 0.5) * 1e3, percentile(latencies, 0.99) * 1e3, cpu,
                     f">= {TARGET_RATIO:g}x etcd: {verdict(rate >= TARGET_RATIO * etcd_rate)}"])
        load.mark("waltz")
    return "\n".join([
        load.line(), "",
        f"closed loop, {WRITERS} writers, 512 B values, {seconds:g} s after {warmup:g} s warmup, everything on this "
        "machine (etcd: 3 members; Waltz: 3 storage replicas + 1 server + ZooKeeper)",
        table(["", "writes/s", "x etcd", "p50 ms", "p99 ms", "server-side CPU s/1000", "target"], rows),
        "server-side CPU: the etcd members, or Waltz's server and storage nodes (clients and ZooKeeper aside).",
    ])


main = main_for(__doc__.split("\n\n")[0], run)

if __name__ == "__main__":
    raise SystemExit(main(None))
