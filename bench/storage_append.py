"""A storage node's work for one append request, in one process, next to a baseline revision in the same run.

    python -m bench.storage_append [--baseline REV] [--rounds N] [--batches N] [--records N] [--bytes N] [--dir DIR]

No network and no event loop: what a storage node does with a StorageRequest of --records records of --bytes data
bytes each, sent the way a Waltz server sends them (store/wire.append_pending_request: encoded_records), step by
step, on a real partition in DIR (default: the system's temporary directory; it sets the disk):
- parse: StorageRequest.FromString of the serialized request;
- check: batch.encode_appends, the records' checks (ids, lengths, both CRCs of every record) and their offsets;
- append: RequestExecutor.execute_appends, everything of an append (the checks, the data and index writes, the
  fdatasync, the metrics, the answer);
- floor: os.pwrite + os.fdatasync of the same bytes to a file of its own, in DIR: what durability costs whatever
  the code.
Worker processes of the same code differ by up to a quarter here at times (the parse, the same code on both sides,
shows it), so the candidate's workers also run the check of both revisions in one process, request by request in
turn (the baseline's waltz_storage/batch.py loaded from its file): the row "check, one process" is the steadier
figure for that step.

The baseline is another revision's storage package (default: where this branch left main, `git merge-base HEAD
main`), taken from its checkout under the benchmark cache (bench.revisions, as bench.append_bench --baseline makes
it) and put first on PYTHONPATH of its worker processes; the rest (protos, common, the server's encoder) is this
checkout's. Each round runs one worker per revision, alternating which goes first; the table shows the least CPU of
the rounds (a busy machine only ever adds) and the candidate/baseline ratio. Process CPU time (user + system, the
kernel's share of the writes and the fdatasync included) is the figure.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from bench.revisions import REPO, checkout

STEPS = ("parse", "check", "append", "floor")


def build_requests(batches: int, records: int, size: int) -> list[bytes]:
    """Serialized append requests of transactions 0.. as a server sends them, records data bytes each."""
    from waltz.v1 import common_pb2
    from waltz_common.types import crc32
    from waltz_server.store.api import NewRecord
    from waltz_server.store.wire import append_pending_request

    rows = []
    for i in range(records):
        data = os.urandom(size)
        req_id = common_pb2.ReqId(client_id=i, generation=1, partition_id=0, seq_num=i)
        rows.append(NewRecord(req_id, i & 0xFF, data, crc32(data)))
    return [
        append_pending_request(1, 0, b * records, rows, b * records - 1).SerializeToString() for b in range(batches)
    ]


def measure(requests: list[bytes], directory: Path) -> dict[str, float]:
    """CPU seconds of each step over all requests, on a fresh partition in directory."""
    from waltz.v1 import storage_pb2
    from waltz_storage.batch import encode_appends
    from waltz_storage.dispatch import Limits, RequestExecutor
    from waltz_storage.metrics import StorageMetrics
    from waltz_storage.storage_manager import StorageManager

    cpu = dict.fromkeys(STEPS, 0.0)
    parse = storage_pb2.StorageRequest.FromString
    clock = time.process_time
    with StorageManager(directory / "node", uuid.uuid4(), 1) as manager:
        manager.assign(0)
        executor = RequestExecutor(manager, Limits(4 << 20, 64 << 20), StorageMetrics())
        partition = manager.partition(0)
        partition.fence.admit(1)
        fd = os.open(directory / "floor", os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            position = 0
            for raw in requests:
                started = clock()
                request = parse(raw).append
                parsed = clock()
                batch = encode_appends((request,), partition.max_transaction_id + 1, 4 << 20)
                checked = clock()
                (answer,) = executor.execute_appends((request,))
                appended = clock()
                os.pwrite(fd, batch.data if batch is not None else b"", position)
                os.fdatasync(fd)
                floor = clock()
                if batch is None or answer.WhichOneof("response") != "success":
                    raise AssertionError(f"the append was refused: {answer}")
                position += len(batch.data)
                cpu["parse"] += parsed - started
                cpu["check"] += checked - parsed
                cpu["append"] += appended - checked
                cpu["floor"] += floor - appended
        finally:
            os.close(fd)
    return cpu


def checks_side_by_side(requests: list[bytes], baseline_batch: Path, records: int) -> tuple[float, float]:
    """CPU seconds of the baseline's encode_appends (loaded from baseline_batch) and of this process's, over the
    same parsed requests, each request checked by one then the other (taking turns at going first)."""
    from waltz.v1 import storage_pb2
    from waltz_storage.batch import encode_appends

    spec = importlib.util.spec_from_file_location("baseline_batch", baseline_batch)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sides = (module.encode_appends, encode_appends)
    cpu = [0.0, 0.0]
    clock = time.process_time
    for i, raw in enumerate(requests):
        request = storage_pb2.StorageRequest.FromString(raw).append
        for side in (0, 1) if i % 2 == 0 else (1, 0):
            started = clock()
            batch = sides[side]((request,), i * records, 4 << 20)
            cpu[side] += clock() - started
            if batch is None:
                raise AssertionError("a request was refused")
    return cpu[0], cpu[1]


def worker(args: argparse.Namespace) -> None:
    requests = build_requests(args.batches, args.records, args.bytes)
    with tempfile.TemporaryDirectory(prefix="waltz-storage-append-", dir=args.dir) as directory:
        measure(requests[: max(1, len(requests) // 10)], Path(directory) / "warmup")  # imports, first files
        cpu = measure(requests, Path(directory) / "run")
    if args.baseline_batch:
        cpu["check (baseline, one process)"], cpu["check (candidate, one process)"] = checks_side_by_side(
            requests, Path(args.baseline_batch), args.records
        )
    import waltz_storage

    print(json.dumps({"cpu": cpu, "package": str(Path(waltz_storage.__file__).parent)}))


def run_worker(args: argparse.Namespace, package_root: Path | None, baseline_batch: Path | None) -> dict[str, Any]:
    env = dict(os.environ)
    if package_root is not None:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(package_root), env.get("PYTHONPATH", "")) if p)
    command = [sys.executable, "-m", "bench.storage_append", "--worker", "--batches", str(args.batches),
               "--records", str(args.records), "--bytes", str(args.bytes)] + (["--dir", args.dir] if args.dir else [])
    if baseline_batch is not None:
        command += ["--baseline-batch", str(baseline_batch)]
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, check=False, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"storage append worker failed ({done.returncode}):\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline", default=None, help="the baseline revision (default: git merge-base HEAD main)")
    parser.add_argument("--rounds", type=int, default=3, help="worker runs per revision (alternating order)")
    parser.add_argument("--batches", type=int, default=300, help="append requests per run")
    parser.add_argument("--records", type=int, default=100, help="records per append request")
    parser.add_argument("--bytes", type=int, default=512, help="data bytes per record")
    parser.add_argument("--dir", default=None, help="where the partition and the floor's file are (sets the disk)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--baseline-batch", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(args)
        return
    revision = args.baseline or subprocess.run(["git", "-C", str(REPO), "merge-base", "HEAD", "main"],
                                               capture_output=True, text=True, check=True).stdout.strip()
    base = checkout(revision)
    roots = {"baseline": base.path / "services" / "storage", "candidate": None}
    base_batch = base.path / "services" / "storage" / "waltz_storage" / "batch.py"
    runs: dict[str, list[dict[str, float]]] = {"baseline": [], "candidate": []}
    for r in range(args.rounds):
        for name in ("baseline", "candidate") if r % 2 == 0 else ("candidate", "baseline"):
            result = run_worker(args, roots[name], None if roots[name] else base_batch)
            expected = str((roots[name] or REPO / "services" / "storage") / "waltz_storage")
            if result["package"] != expected:
                raise RuntimeError(f"the {name} worker imported {result['package']}, not {expected}")
            runs[name].append(result["cpu"])
    per = 1e6 / args.batches
    print(f"storage append: {args.batches} requests x {args.records} records of {args.bytes} B, {args.rounds} rounds, "
          f"least CPU; load average {os.getloadavg()[0]:.2f}")
    print(f"baseline {revision} = {base.commit[:12]}; candidate = this checkout")
    print(f"{'step':<8} {'baseline us/request':>20} {'candidate us/request':>21} {'per record':>15} {'ratio':>6}")
    for step in STEPS:
        old, new = (min(run[step] for run in runs[name]) * per for name in ("baseline", "candidate"))
        print(f"{step:<8} {old:>20.1f} {new:>21.1f} {old / args.records:>7.2f}/{new / args.records:<7.2f} "
              f"{new / old if old else 0.0:>6.2f}")
    old, new = (min(run[f"check ({name}, one process)"] for run in runs["candidate"]) * per
                for name in ("baseline", "candidate"))
    print(f"{'check, one process':<8} {old:>10.1f} {new:>21.1f} {old / args.records:>7.2f}/{new / args.records:<7.2f} "
          f"{new / old if old else 0.0:>6.2f}")


if __name__ == "__main__":
    main()
