"""A baseline revision of one package in the same run: its tree exported once, worker processes that import it
first, rounds alternating which revision goes first (bench.feed_path, bench.server_path)."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bench.revisions import CACHE, REPO, resolve


def default_baseline() -> str:
    """Where this branch left main (git merge-base HEAD main)."""
    return subprocess.run(["git", "-C", str(REPO), "merge-base", "HEAD", "main"],
                          capture_output=True, text=True, check=True).stdout.strip()


def export(revision: str, tree: str, label: str) -> tuple[str, Path]:
    """The revision's `tree` (a directory holding one package, e.g. services/server) exported once under the
    benchmark cache as label-<commit>: (commit, the exported tree)."""
    commit, root = export_trees(revision, (tree,), label)
    return commit, root / tree


def export_trees(revision: str, trees: Sequence[str], label: str) -> tuple[str, Path]:
    """The revision's `trees` (directories, e.g. common and services/server) exported once under the benchmark
    cache as label-<commit>: (commit, the directory holding them). Each export is extracted beside it and renamed
    into place, so a process that finds it sees it whole (tests/chaos/test_upgrade.py runs the previous release's
    services from such an export)."""
    commit = resolve(revision)
    path = CACHE / f"{label}-{commit}"
    missing = [tree for tree in trees if not (path / tree).is_dir()]
    if missing:
        CACHE.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{label}-{commit[:12]}-", dir=CACHE))
        try:
            with tempfile.TemporaryFile() as archive:
                subprocess.run(["git", "-C", str(REPO), "archive", "--format=tar", commit, *missing], stdout=archive,
                               check=True)
                archive.seek(0)
                with tarfile.open(fileobj=archive) as tar:
                    tar.extractall(staging, filter="data")
            path.mkdir(exist_ok=True)
            for tree in missing:
                (path / tree).parent.mkdir(parents=True, exist_ok=True)
                try:
                    (staging / tree).rename(path / tree)
                except OSError:  # another process put it there meanwhile: the same files
                    if not (path / tree).is_dir():
                        raise
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return commit, path


def run_worker(module: str, arguments: list[str], package_root: Path | None) -> dict[str, Any]:
    """`python -m module --worker arguments` with package_root first on PYTHONPATH (None: this checkout's); the
    JSON object on the last line of its output."""
    env = dict(os.environ)
    if package_root is not None:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(package_root), env.get("PYTHONPATH", "")) if p)
    command = [sys.executable, "-m", module, "--worker", *arguments]
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, check=False, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"{module} worker failed ({done.returncode}):\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def alternate(rounds: int, root: Path, tree: str, package: str, run: Callable[[Path | None], dict[str, Any]]
              ) -> dict[str, list[dict[str, Any]]]:
    """run(root) for the baseline and run(None) for this checkout, `rounds` times each, alternating which goes
    first. Each result's "package" must be the directory its worker imported `package` from: root's for the
    baseline, this checkout's tree for the candidate."""
    runs: dict[str, list[dict[str, Any]]] = {"baseline": [], "candidate": []}
    for r in range(rounds):
        order = ("baseline", "candidate") if r % 2 == 0 else ("candidate", "baseline")
        for name in order:
            result = run(root if name == "baseline" else None)
            expected = str(root / package) if name == "baseline" else str(REPO / tree / package)
            if result["package"] != expected:
                raise RuntimeError(f"the {name} worker imported {result['package']}, not {expected}")
            runs[name].append(result)
    return runs


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options every such benchmark takes: --baseline, --rounds, --profile (and the worker's own flag)."""
    parser.add_argument("--baseline", default=None, help="the baseline revision (default: git merge-base HEAD main)")
    parser.add_argument("--rounds", type=int, default=5, help="worker runs per revision (alternating order)")
    parser.add_argument("--profile", action="store_true", help="profile the candidate under cProfile instead")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)


def print_table(runs: dict[str, list[dict[str, Any]]], count: str, unit: str, units: str) -> None:
    """Per revision the best of its rounds (results[count] units in results["wall"] and results["cpu"] seconds):
    units/s, CPU us per unit, wall seconds; then candidate / baseline."""
    print(f"{'revision':<12} {units + '/s':>12} {'CPU us/' + unit:>14} {'wall s':>8}")
    rows = {}
    for name, results in runs.items():
        rate = max(x[count] / x["wall"] for x in results)
        cpu = min(x["cpu"] / x[count] * 1e6 for x in results)
        rows[name] = (rate, cpu)
        print(f"{name:<12} {rate:>12,.0f} {cpu:>14.2f} {min(x['wall'] for x in results):>8.3f}")
    (base_rate, base_cpu), (rate, cpu) = rows["baseline"], rows["candidate"]
    print(f"{'ratio':<12} {rate / base_rate:>12.2f} {cpu / base_cpu:>14.2f}   (candidate / baseline)")


def compare(args: argparse.Namespace, tree: str, package: str, module: str, arguments: list[str]
            ) -> tuple[str, dict[str, list[dict[str, Any]]]]:
    """The rounds of args (add_arguments' options): module's workers with `arguments`, the baseline's `package`
    from its exported `tree` against this checkout's. Returns (a line naming the two, the runs)."""
    revision = args.baseline or default_baseline()
    commit, root = export(revision, tree, module.rpartition(".")[2].replace("_", "-"))
    runs = alternate(args.rounds, root, tree, package, lambda package_root: run_worker(module, arguments, package_root))
    return f"baseline {revision} = {commit[:12]}; candidate = this checkout", runs
