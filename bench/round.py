"""The cost of a round: CPU per append of every process at 1 and 10 appends in flight, against the floors of the
transport measured in the same run, and open-loop latency, for this checkout and a baseline revision.

    .venv/bin/python -m bench.round [--quick] [--baseline REV] [--rounds N] [--seconds S] [--only SECTION]
                                    [--skip-open-loop] [--dir DIR]

Each round starts one LocalCluster (ZooKeeper shared, 3 storage nodes, 1 server, 1 partition, 512 B appends) per
side, both kept up for the round: the baseline's (REV, default git merge-base HEAD main: its server, storage, client
and common trees exported under the benchmark cache by bench.package_baseline and put first on the
PYTHONPATH of its services and of its client processes) and this checkout's. Then each load (bench.round_load)
runs on one side's cluster and then on the other's, alternating which goes first from one load and round to the
next, so that both sides of a row are measured seconds apart on this shared machine:
- cpu: the Python client (AsyncWaltzClient, N writers each awaiting its append's commit) and a raw client (one
  ClientMessage with one AppendRequest per append, the next sent when a commit shows in the feed), N = 1 and 10:
  CPU us per committed append of the server, of each storage node and of the client process (all threads) over
  --seconds after a warm-up;
- open: 3 client processes (AsyncWaltzClient, each append in its own task on a fixed schedule, latency from the
  scheduled time) at 1,000 / 3,000 / 5,000 / 10,000 appends/s offered in all, with the appends per store batch
  (the server's waltz_server_store_batch_appends over the load, warm-up included): a count that tells whether group
  commit forms, which a busy machine's timings hide.
Before the loads of each round, the floors (section "floors"): one grpc.aio bidirectional-stream round (512 B each
way, echo server in its own process, both on the services' event loop), one framed storage round
(bench.session_port's "append 1": a storage node's CPU for an append of one 512 B record on its framed session port,
its files in /dev/shm, both revisions' ports), one fdatasync of a 512 B append in the work directory's filesystem
(where the clusters keep their data), and the I/O shapes of a lone append with no Waltz code (bench.io_shape):
the server's (a grpc.aio stream server that writes a frame to each of 3 peers, or 1, over asyncio Protocols per
message and replies at the majority's answer; 1 and 10 in flight, in one task or in a reader and a writer task)
and a storage node's (a peer that pwrites and fdatasyncs each frame in the work directory before answering; the
server's CPU again with 3 of those, its rounds as slow as a storage node makes them), each against the grpc.aio
round's server CPU: the part of the issue's targets that no Python server or node with this
protocol can go under. Every figure printed is the median of the rounds. Asserts nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import logging
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from statistics import median
from typing import Any

from bench import round_load, session_port
from bench.append_bench import WRITER_CLIENT
from bench.curves.common import LoadLog, metric, wait_owned
from bench.package_baseline import default_baseline, export, run_worker
from bench.revisions import REPO
from bench.round_tables import (
    SIDES,
    Row,
    compare_table,
    cpu_rows,
    floor_values,
    floors_table,
    open_rows,
    ratios_table,
    shape_values,
)
from bench.storage_nodes import first_on_pythonpath, require_first_on_pythonpath
from waltz_common.testing.local_cluster import LocalCluster
from waltz_common.testing.zookeeper import ZooKeeperProcess

TREES = ("services/server", "services/storage", "clients/python", "common")
IN_FLIGHT = (1, 10)
RATES = (1000, 3000, 5000, 10000)
OPEN_PROCESSES = 3
SECTIONS = ("cpu", "floors", "open")
CLIENTS = (("Python client", "python"), ("raw client", "raw"))
SHAPES = (("Lone", 3, 1), ("Pipelined", 3, 1), ("Pipelined", 3, 10), ("Lone", 1, 1), ("Pipelined", 1, 1))
"""bench.io_shape's variants (mode, peers, in flight)."""


@dataclass(frozen=True)
class Timing:
    warmup: float
    seconds: float
    rounds: int
    session_blocks: int  # bench.session_port's blocks and block size
    session_block: int
    fdatasyncs: int


QUICK = Timing(0.5, 1.5, 1, 2, 40, 50)
FULL = Timing(1.5, 5.0, 3, 6, 200, 300)  # 3 rounds: a median, not the mean of two


def worker(spec: dict[str, Any], package_root: Path | None, baseline_root: Path | None) -> dict[str, Any]:
    """A load of bench.round_load in a worker process with package_root first on its PYTHONPATH; checks that it
    imported the client from there (or from this checkout)."""
    result = run_worker("bench.round", [json.dumps(spec)], package_root)
    expected = (baseline_root if package_root is not None and baseline_root is not None else REPO) / "clients" / \
        "python" / "waltz_client"
    if result["packages"]["client"] != str(expected):
        raise RuntimeError(f"the worker imported the client from {result['packages']['client']}, not {expected}")
    return result


@contextlib.contextmanager
def side_cluster(workdir: Path, zookeeper: str, root: str, package_root: Path | None, baseline_root: Path | None,
                 timing: Timing) -> Iterator[Callable[[dict[str, Any]], dict[str, Any]]]:
    """One side's cluster, started with package_root first on its processes' PYTHONPATH (None: this checkout's);
    yields a function that runs a load's spec against it in a worker of the same side."""
    with contextlib.ExitStack() as stack:
        with first_on_pythonpath(package_root):  # the cluster's processes start here and inherit it
            cluster = stack.enter_context(LocalCluster(workdir, storage_nodes=3, servers=1, partitions=1,
                                                       zookeeper=zookeeper, cluster_root=root))
        if package_root is not None:
            require_first_on_pythonpath(cluster.pids(), ("server", "storage"), package_root)
        common = {"config": cluster.client_config(**WRITER_CLIENT), "address": wait_owned(cluster, 1)[0],
                  "pids": cluster.pids(), "zookeeper": zookeeper, "root": root, "warmup": timing.warmup,
                  "seconds": timing.seconds}
        batches_url = f"http://127.0.0.1:{cluster.servers[0].metrics_port}/metrics"

        def run(spec: dict[str, Any]) -> dict[str, Any]:
            before = store_batches(batches_url)
            result = worker({**common, **spec}, package_root, baseline_root)
            after = store_batches(batches_url)
            return {**result, "store_batches": after[0] - before[0], "store_batch_appends": after[1] - before[1]}

        yield run


def store_batches(url: str) -> tuple[float, float]:
    """The server's store batches so far and the appends they held (waltz_server_store_batch_appends)."""
    return (metric(url, "waltz_server_store_batch_appends_count"), metric(url, "waltz_server_store_batch_appends_sum"))


def loads(sections: set[str], seconds: float) -> list[tuple[dict[str, Any], Callable[[dict[str, Any]],
                                                                                      dict[Row, float]]]]:
    """The loads of the sections asked for: (spec, what makes its rows of its result)."""
    found: list[tuple[dict[str, Any], Callable[[dict[str, Any]], dict[Row, float]]]] = []
    if "cpu" in sections:
        found += [({"load": load, "inflight": n}, functools.partial(cpu_rows, f"{label}, {n} in flight",
                                                                     seconds=seconds))
                  for label, load in CLIENTS for n in IN_FLIGHT]
    if "open" in sections:
        found += [({"load": "open", "rate": rate, "processes": OPEN_PROCESSES},
                   functools.partial(open_rows, rate, seconds=seconds)) for rate in RATES]
    return found


def fdatasync_us(directory: Path, count: int) -> float:
    """The median wall us of appending 512 B to a file in directory and fdatasync-ing it."""
    path = directory / "fdatasync-floor"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    spent = []
    try:
        record = os.urandom(512)
        for _ in range(count):
            started = time.perf_counter()
            os.write(fd, record)
            os.fdatasync(fd)
            spent.append(time.perf_counter() - started)
    finally:
        os.close(fd)
        path.unlink()
    return median(spent) * 1e6


def floors(workdir: Path, port_file: Path, timing: Timing) -> dict[str, float]:
    """One round's floors (the same code for both sides, but for the framed port's)."""
    echo = worker({"load": "echo", "warmup": timing.warmup, "seconds": timing.seconds}, None, None)
    shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
    try:
        with tempfile.TemporaryDirectory(prefix="waltz-round-port-", dir=shm) as nodes:
            session = session_port.one_node(port_file, Path(nodes), timing.session_blocks, timing.session_block)
    except Exception as failure:  # a revision without a framed port: the other floors still hold
        print(f"framed storage round not measured: {failure!r}", file=sys.stderr)
        session = None
    shape = {"load": "shape", "warmup": timing.warmup, "seconds": timing.seconds}
    network = worker({**shape, "variants": SHAPES, "directory": None}, None, None)["variants"]
    storage = worker({**shape, "variants": SHAPES[:2], "directory": str(workdir)}, None, None)["variants"]
    return floor_values(echo, session, fdatasync_us(workdir, timing.fdatasyncs), shape_values(network, storage))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="short windows and one round (a smoke run)")
    parser.add_argument("--baseline", default=None, help="the baseline revision (default: git merge-base HEAD main)")
    parser.add_argument("--rounds", type=int, default=None, help="clusters per side, alternating which goes first")
    parser.add_argument("--seconds", type=float, default=None, help="measured seconds of each load")
    parser.add_argument("--only", action="append", choices=SECTIONS, help="only this section (repeatable)")
    parser.add_argument("--skip-open-loop", action="store_true", help="leave out the open loop")
    parser.add_argument("--dir", default=None, help="work directory (default: a temporary one)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("spec", nargs="?", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("kazoo").setLevel(logging.ERROR)
    if args.worker:
        print(json.dumps(round_load.run(json.loads(args.spec))), flush=True)
        return 0
    base = QUICK if args.quick else FULL
    timing = Timing(base.warmup, args.seconds or base.seconds, args.rounds or base.rounds, base.session_blocks,
                    base.session_block, base.fdatasyncs)
    sections = set(args.only or SECTIONS) - ({"open"} if args.skip_open_loop else set())
    revision = args.baseline or default_baseline()
    trees = [export(revision, tree, "round") for tree in TREES]
    commit, baseline_root = trees[0][0], trees[0][1].parent.parent
    package_root = Path(os.pathsep.join(str(path) for _, path in trees))
    port_file = baseline_root / "services" / "storage" / "waltz_storage" / "session_port.py"
    runs: dict[str, list[dict[Row, float]]] = {"baseline": [], "candidate": []}
    floor_rounds: list[dict[str, float]] = []
    load = LoadLog()
    with tempfile.TemporaryDirectory(prefix="waltz-round-", dir=args.dir) as workdir, \
            ZooKeeperProcess(Path(workdir) / "zookeeper") as zookeeper:
        load.mark("start")
        for r in range(timing.rounds):
            with contextlib.ExitStack() as stack:
                clusters = {name: stack.enter_context(side_cluster(
                    Path(workdir) / f"round-{r + 1}-{name}", zookeeper.connect_string, f"/bench/round{r + 1}{name}",
                    package_root if name == "baseline" else None, baseline_root, timing))
                    for name in SIDES if sections & {"cpu", "open"}}
                if "floors" in sections:
                    floor_rounds.append(floors(Path(workdir), port_file, timing))
                rows: dict[str, dict[Row, float]] = {name: {} for name in SIDES}
                for i, (spec, rows_of) in enumerate(loads(sections, timing.seconds)):
                    for name in SIDES if (r + i) % 2 == 0 else SIDES[::-1]:
                        rows[name].update(rows_of(clusters[name](spec)))
                    print(f"round {r + 1}: {spec} done", file=sys.stderr, flush=True)
            for name in SIDES:
                runs[name].append(rows[name])
            load.mark(f"after round {r + 1}")
    print(load.line())
    print(f"baseline: {revision} = {commit[:12]} (its server, storage, client and common); candidate: this "
          f"checkout. {timing.rounds} round(s), each side's figure the median of its rounds; {timing.seconds:g} s "
          f"measured after {timing.warmup:g} s of warm-up; 512 B appends")
    cpu_side = {name: [{k: v for k, v in r.items() if not k[0].endswith("offered")} for r in rs]
                for name, rs in runs.items()}
    if "cpu" in sections:
        print("\n1. CPU us per committed append of every process (all threads), committed/s, errors")
        print(compare_table(cpu_side))
    if "floors" in sections:
        print("\n2. floors, measured before each round's loads (the same code for both sides but the framed "
              "port's); median of the rounds, then each round")
        print(floors_table(floor_rounds))
    if "floors" in sections:
        print("\n3. CPU per lone append (1 in flight) / the grpc.aio round's CPU on the same side of a stream "
              "(issue 42's targets are for the Python client's rows), then the I/O shapes' / the grpc.aio round's "
              "server CPU (the median of each round's ratio; the same code on both sides): a floor above a target "
              "puts it out of reach")
        print(ratios_table(cpu_side, floor_rounds))
    if "open" in sections:
        print(f"\n4. open loop, {OPEN_PROCESSES} client processes, appends/s offered in all; latency from the "
              "scheduled time")
        print(compare_table({name: [{k: v for k, v in r.items() if k[0].endswith("offered")} for r in rs]
                             for name, rs in runs.items()}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
