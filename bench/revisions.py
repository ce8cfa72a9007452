"""A baseline revision in the same run: its own checkout and environment, its own benchmark, rows side by side.

`bench.append_bench --baseline REV` uses this. REV (any name git knows: a commit, a tag, main~3) is exported
once into a cache directory (`git archive`, so the repository's worktree list is left alone) and given its own
virtualenv by that revision's scripts/bootstrap. Then each round runs the benchmark of both revisions, one
after the other in fresh processes, alternating which goes first, and the table of each is parsed into rows
so that every row gets its ratio (candidate / baseline). The baseline runs its own bench/append_bench.py: the
rows are read from the table it prints, which has kept its layout since before issue 24.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from statistics import mean

REPO = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("WALTZ_BENCH_CACHE", Path.home() / ".cache" / "waltz-bench"))

# The cluster table: f"{label:<30} {procs:>5} {rate:>12,.0f} {p50:>8} {p99:>8} {errors:>6} | ..."
_CLUSTER = {"label": (0, 30), "rate": (37, 49), "p50": (50, 58), "p99": (59, 67)}
# The CPU table: f"{label:<36} {server:>7.3f} {storage:>7.3f} {clients:>7.3f} {zk:>5.2f} {total:>6.3f} | ..."
_CPU_COLUMNS = ("server", "storage", "clients", "zookeeper", "total")
_COMPARED_CPU = ("server", "storage", "clients", "total")  # ZooKeeper's share rounds to 0.00
_WRITER_LABELS = ("1 writers", "10 writers", "100 writers", "open loop 1,000/s")


class RevisionError(RuntimeError):
    """A baseline revision that cannot be checked out, installed or run, or whose table cannot be read."""


@dataclass(frozen=True)
class Checkout:
    revision: str  # as asked
    commit: str  # the full hash
    path: Path

    @property
    def python(self) -> Path:
        return self.path / ".venv" / "bin" / "python"


def resolve(revision: str, repo: Path = REPO) -> str:
    """The full commit hash of `revision` in the repository of this checkout."""
    done = subprocess.run(["git", "-C", str(repo), "rev-parse", "--verify", "--quiet", f"{revision}^{{commit}}"],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RevisionError(f"git does not know the revision {revision!r} in {repo}")
    return done.stdout.strip()


def checkout(revision: str, cache: Path = CACHE, repo: Path = REPO) -> Checkout:
    """The revision exported under cache/<commit> with its .venv (made by its scripts/bootstrap), made once."""
    commit = resolve(revision, repo)
    path = cache / commit
    if not (path / "pyproject.toml").exists():
        cache.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{commit[:12]}-", dir=cache))
        archive = subprocess.run(["git", "-C", str(repo), "archive", "--format=tar", commit],
                                 capture_output=True, check=False)
        if archive.returncode != 0:
            raise RevisionError(f"git archive {commit} failed: {archive.stderr.decode(errors='replace').strip()}")
        with tempfile.TemporaryFile() as tar:
            tar.write(archive.stdout)
            tar.seek(0)
            with tarfile.open(fileobj=tar) as files:
                files.extractall(staging, filter="tar")
        staging.rename(path)
    found = Checkout(revision, commit, path)
    print(f"revision {revision} ({commit[:12]}) in {path}: scripts/bootstrap", file=sys.stderr, flush=True)
    done = subprocess.run([str(path / "scripts" / "bootstrap")], cwd=path, check=False)
    if done.returncode != 0 or not found.python.exists():
        raise RevisionError(f"scripts/bootstrap of {revision} in {path} failed (exit status {done.returncode})")
    return found


def run_bench(cwd: Path, python: Path, args: list[str], timeout: float) -> str:
    """Run `python -m bench.append_bench ARGS` in cwd (a checkout, which imports its own code); its stdout."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    done = subprocess.run([str(python), "-m", "bench.append_bench", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout, check=False)
    if done.returncode != 0:
        raise RevisionError(f"the benchmark in {cwd} failed (exit status {done.returncode}):\n{done.stderr[-3000:]}")
    return done.stdout


# ---------------------------------------------------------------------------------------- rows


@dataclass
class Rows:
    """One run's figures by row name (per second, milliseconds, CPU seconds per 1,000 committed appends)."""

    values: dict[str, float] = field(default_factory=dict)


def _number(text: str) -> float | None:
    text = text.strip().replace(",", "")
    return float(text) if text else None


def parse(table: str) -> Rows:
    """The rows of one append_bench table; RevisionError when a row every revision prints is missing."""
    rows = Rows()
    cpu_section = False
    for line in table.splitlines():
        if line.startswith("CPU seconds per 1,000 committed appends"):
            cpu_section = True
            continue
        if cpu_section:
            label = line[:36].strip()
            if label in _WRITER_LABELS and "|" in line:
                numbers = line[36:].split("|")[0].split()
                for column, value in zip(_CPU_COLUMNS, numbers, strict=True):
                    if column in _COMPARED_CPU:
                        rows.values[f"CPU/1k {label}: {column}"] = float(value)
            elif not line.strip():
                cpu_section = False
            continue
        if "|" not in line:
            continue
        label = line[slice(*_CLUSTER["label"])].strip()
        if not label.startswith(("prefill:", "feed from 0:")) and not label.endswith(", committed"):
            continue  # a heading
        rate, p50, p99 = (_number(line[slice(*_CLUSTER[c])]) for c in ("rate", "p50", "p99"))
        if label.startswith("prefill:") and rate is not None:
            rows.values["prefill, appends/s"] = rate
        elif label.startswith("feed from 0: raw") and rate is not None:
            rows.values["feed from 0: raw Stream /s"] = rate
        elif label.startswith("feed from 0: AsyncWaltzClient") and rate is not None:
            rows.values["feed from 0: AsyncWaltzClient /s"] = rate
        elif label.endswith(", committed") and rate is not None:
            name = label.removesuffix(", committed")
            rows.values[f"{name}: committed/s"] = rate
            if p50 is not None and p99 is not None:
                rows.values[f"{name}: p50 ms"] = p50
                rows.values[f"{name}: p99 ms"] = p99
    wanted = ["feed from 0: AsyncWaltzClient /s", "100 writers: committed/s", "CPU/1k 100 writers: total"]
    missing = [name for name in wanted if name not in rows.values]
    if missing:
        raise RevisionError(f"rows missing from the benchmark's table: {', '.join(missing)}")
    return rows


def _fmt(value: float) -> str:
    if value >= 100:
        return f"{value:,.0f}"
    return f"{value:.3f}" if value < 1 else f"{value:.2f}"


def compare(baseline: list[Rows], candidate: list[Rows], baseline_name: str, candidate_name: str) -> str:
    """Each row: the baseline's and the candidate's runs, and candidate / baseline of their means."""
    names = [n for n in baseline[0].values if all(n in r.values for r in baseline + candidate)]
    width = max(len(n) for n in names)
    runs = max(len(baseline), len(candidate))
    col = max(9 * runs, len(baseline_name), len(candidate_name)) + 2
    head = f"{'':<{width}}  {baseline_name:>{col}}  {candidate_name:>{col}}  {'ratio':>6}"
    lines = [head, "-" * len(head)]
    for name in names:
        base = [r.values[name] for r in baseline]
        cand = [r.values[name] for r in candidate]
        ratio = mean(cand) / mean(base) if mean(base) else float("nan")
        lines.append(f"{name:<{width}}  {' / '.join(_fmt(v) for v in base):>{col}}  "
                     f"{' / '.join(_fmt(v) for v in cand):>{col}}  {ratio:>6.2f}")
    lines.append("ratio: candidate / baseline of the runs' means (rates: higher is better; ms and CPU: lower is "
                 "better). Runs alternate: round 1 runs the baseline first, round 2 the candidate, and so on.")
    return "\n".join(lines)
