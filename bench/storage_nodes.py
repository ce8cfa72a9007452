"""The storage nodes' (or the server's) CPU per committed append in a cluster, their code against a baseline
revision's in the same run.

    python -m bench.storage_nodes [--package storage|server] [--baseline REV] [--rounds N] [--seconds S]
                                  [--writers W]

LocalClusters (ZooKeeper, 3 storage nodes, 1 server, 1 partition, 512 B transactions, as bench.append_bench) whose
storage nodes (--package storage, the default) or server (--package server) run either the baseline revision's
package (its checkout under the benchmark cache, made by bench.revisions, put first on the cluster's PYTHONPATH) or
this checkout's; everything else (the other service, the writer processes, protos, common) is this checkout's in
both. Each round runs one cluster of each, alternating which goes first, a closed loop of --writers writers for
--seconds after a short warm-up (bench.append_bench's closed_loop), and prints the CPU per committed append of every
process group. Only the swapped package differs, so its row is the one to read, and the other rows show what the
load did to both sides.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

from bench.append_bench import Scale, closed_loop
from bench.baselines import MemorySampler
from bench.package_baseline import default_baseline
from bench.raw_client import raw_stream
from bench.revisions import checkout
from waltz_common.testing.local_cluster import LocalCluster
from waltz_common.testing.zookeeper import ZooKeeperProcess

PREFILL = 20_000
GROUPS = ("server", "storage", "clients")


@contextlib.contextmanager
def first_on_pythonpath(path: Path | None) -> Iterator[None]:
    """path first on PYTHONPATH of the processes started meanwhile (None: unchanged)."""
    saved = os.environ.get("PYTHONPATH")
    if path is not None:
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(path), saved) if p)
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = saved


def require_first_on_pythonpath(pids: dict[str, int], prefixes: tuple[str, ...], path: Path) -> None:
    """RuntimeError unless each process whose name starts with one of prefixes has path first on its PYTHONPATH."""
    wanted = f"PYTHONPATH={path}".encode()
    for name, pid in pids.items():
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        if name.startswith(prefixes) and not any(e.startswith(wanted) for e in environ):
            raise RuntimeError(f"{name} did not get the baseline's packages ({path}) first on its PYTHONPATH")


def one_cluster(workdir: Path, zookeeper: str, root: str, package: str, package_path: Path | None, writers: int,
                seconds: float, sampler: MemorySampler) -> tuple[float, dict[str, float]]:
    """(committed/s, CPU us per committed append by process group) of one cluster, started with package_path (the
    tree holding the package of the processes named `package`: "storage" or "server") first on its processes'
    PYTHONPATH (None: this checkout's package)."""
    with contextlib.ExitStack() as stack:
        with first_on_pythonpath(package_path):  # the cluster's processes start here and inherit it
            cluster = stack.enter_context(LocalCluster(workdir, storage_nodes=3, servers=1, partitions=1,
                                                       zookeeper=zookeeper, cluster_root=root))
        if package_path is not None:
            require_first_on_pythonpath(cluster.pids(), (package,), package_path)
        asyncio.run(raw_stream(cluster, -1, PREFILL, 0))
        scale = Scale(0, 2.0, seconds, seconds, 0.0, 0, 0, 0, 0)
        row = closed_loop(cluster, writers, 1, seconds, scale, sampler)
        return row.rate, {group: row.cpu[group] * 1000 for group in GROUPS}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--package", choices=("storage", "server"), default="storage",
                        help="the package swapped between the baseline and this checkout")
    parser.add_argument("--baseline", default=None, help="the baseline revision (default: git merge-base HEAD main)")
    parser.add_argument("--rounds", type=int, default=3, help="clusters per side (alternating which goes first)")
    parser.add_argument("--seconds", type=float, default=12.0, help="measured seconds of each closed loop")
    parser.add_argument("--writers", type=int, default=100, help="writers of the closed loop")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("kazoo").setLevel(logging.ERROR)
    revision = args.baseline or default_baseline()
    base = checkout(revision)
    paths = {"baseline": base.path / "services" / args.package, "candidate": None}
    results: dict[str, list[tuple[float, dict[str, float]]]] = {"baseline": [], "candidate": []}
    what = "storage nodes" if args.package == "storage" else "server"
    print(f"{what} of {revision} = {base.commit[:12]} (baseline) and of this checkout (candidate), "
          f"{args.writers} writers, {args.seconds:.0f} s each; CPU us per committed append")
    with tempfile.TemporaryDirectory(prefix="waltz-storage-nodes-") as workdir, \
            ZooKeeperProcess(Path(workdir) / "zookeeper") as zookeeper, MemorySampler() as sampler:
        n = 0
        for r in range(args.rounds):
            for name in ("baseline", "candidate") if r % 2 == 0 else ("candidate", "baseline"):
                n += 1
                load = os.getloadavg()[0]
                rate, cpu = one_cluster(Path(workdir) / f"cluster-{n}", zookeeper.connect_string, f"/bench/nodes{n}",
                                        args.package, paths[name], args.writers, args.seconds, sampler)
                results[name].append((rate, cpu))
                print(f"round {r + 1} {name:<9} load {load:5.2f}  committed/s {rate:>8,.0f}"
                      f"  server {cpu['server']:5.1f}  storage x3 {cpu['storage']:5.1f}"
                      f" (per node {cpu['storage'] / 3:5.2f})"
                      f"  writers {cpu['clients']:5.1f}", flush=True)
    means = {name: {g: sum(c[g] for _, c in rows) / len(rows) for g in GROUPS} for name, rows in results.items()}
    rates = {name: sum(rate for rate, _ in rows) / len(rows) for name, rows in results.items()}
    print(f"{'mean':<9} {'committed/s':>12} {'server':>8} {'storage x3':>11} {'per node':>9} {'writers':>8}")
    for name in ("baseline", "candidate"):
        m = means[name]
        print(f"{name:<9} {rates[name]:>12,.0f} {m['server']:>8.1f} {m['storage']:>11.1f} {m['storage'] / 3:>9.2f} "
              f"{m['clients']:>8.1f}")
    ratio = {g: means["candidate"][g] / means["baseline"][g] for g in GROUPS}
    print(f"{'ratio':<9} {rates['candidate'] / rates['baseline']:>12.2f} {ratio['server']:>8.2f} "
          f"{ratio['storage']:>11.2f} {ratio['storage']:>9.2f} {ratio['clients']:>8.2f}   (candidate / baseline)")


if __name__ == "__main__":
    main()
