"""bench.ingest_steady's pure part: the line fit of micro-batch time against rows, the freshness of transactions
(commit to readable in Parquet), the Parquet sink's `_spark_metadata` log entries, the micro-batch durations out of
a query's progress reports, and the tables. No I/O: the shells (bench.ingest_steady, bench.ingest_stream) feed it."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from bench.baselines import percentile
from bench.curves.common import table

Key = tuple[int, int]
"""(partition, transaction id) of one transaction."""

PARTITION_DIR = re.compile(r"(?:^|/)partition=(-?\d+)(?:/|$)")
# The phases of a micro-batch in Spark's progress report (durationMs), in the order they run.
PHASES = ("latestOffset", "getBatch", "queryPlanning", "walCommit", "addBatch", "commitOffsets")


@dataclass(frozen=True)
class Line:
    """time = intercept + slope * rows, the least-squares line through the points."""

    intercept: float
    slope: float
    points: int


def fit_line(points: Sequence[tuple[float, float]]) -> Line:
    """Least squares of y on x; needs two distinct x (one x only gives no slope to tell a fixed cost from)."""
    n = len(points)
    if n < 2 or len({x for x, _ in points}) < 2:
        raise ValueError(f"a line needs points at two sizes or more, got {sorted({x for x, _ in points})}")
    mean_x = sum(x for x, _ in points) / n
    mean_y = sum(y for _, y in points) / n
    sxx = sum((x - mean_x) ** 2 for x, _ in points)
    sxy = sum((x - mean_x) * (y - mean_y) for x, y in points)
    slope = sxy / sxx
    return Line(mean_y - slope * mean_x, slope, n)


@dataclass(frozen=True)
class Freshness:
    """Seconds from each transaction's commit to its row being readable in the table, over those both saw."""

    landed: int
    missing: int
    p50: float
    p99: float
    max: float


def freshness(commits: Mapping[Key, float], visible: Mapping[Key, float]) -> Freshness:
    """Freshness of the committed transactions (wall-clock seconds); those not visible yet count as missing.

    Rows visible that no appender committed (another load's) are left out."""
    delays = [visible[key] - at for key, at in commits.items() if key in visible]
    return Freshness(
        landed=len(delays),
        missing=len(commits) - len(delays),
        p50=percentile(delays, 0.5),
        p99=percentile(delays, 0.99),
        max=max(delays, default=float("nan")),
    )


def metadata_files(names: Sequence[str]) -> list[str]:
    """The batch files of a `_spark_metadata` directory ("7", "9.compact"), by batch id; temporary files left out."""
    batches = [name for name in names if re.fullmatch(r"\d+(\.compact)?", name)]
    return sorted(batches, key=lambda name: int(name.split(".")[0]))


def metadata_paths(text: str) -> list[str]:
    """The data files a `_spark_metadata` log file adds: a version line ("v1"), then one JSON entry a line."""
    lines = text.splitlines()
    if not lines or not lines[0].startswith("v"):
        raise ValueError(f"not a file sink log (first line {lines[:1]})")
    entries = [json.loads(line) for line in lines[1:] if line.strip()]
    return [entry["path"] for entry in entries if entry.get("action", "add") == "add"]


def partition_of(path: str) -> int:
    """The Waltz partition of a data file written with partitionBy("partition"): its directory partition=<N>."""
    match = PARTITION_DIR.search(path)
    if match is None:
        raise ValueError(f"no partition=<N> directory in {path}")
    return int(match.group(1))


@dataclass(frozen=True)
class Batch:
    """One micro-batch that read rows: how many, and the milliseconds of its trigger and of each phase."""

    rows: int
    ms: float
    phases: Mapping[str, float]


def batches(progress: Sequence[Mapping[str, Any]]) -> list[Batch]:
    """The micro-batches with input rows out of a query's recentProgress (its idle triggers left out)."""
    return [
        Batch(
            int(p["numInputRows"]),
            float(p["durationMs"].get("triggerExecution", 0)),
            {phase: float(p["durationMs"].get(phase, 0)) for phase in PHASES},
        )
        for p in progress
        if p["numInputRows"]
    ]


def spread(values: Sequence[float]) -> tuple[float, float, float]:
    """(p50, p99, max), NaN when there are no values."""
    return percentile(list(values), 0.5), percentile(list(values), 0.99), max(values, default=float("nan"))


@dataclass(frozen=True)
class Run:
    """One steady-state measurement: wall seconds, and CPU seconds of Spark's processes and of the cluster's."""

    name: str
    seconds: float
    spark_cpu: float
    cluster_cpu: float


def rate_rows(rows: int, ceiling: Run, runs: Sequence[Run]) -> str:
    """The steady-state table: seconds, rows/s and its ratio to the ceiling's; CPU seconds per 100k rows of Spark's
    processes (its ratio to the ceiling's: a count the machine's load moves less than the wall clock) and the
    cluster's."""
    body = []
    for run in [ceiling, *runs]:
        rate = rows / run.seconds
        spark, cluster = run.spark_cpu * 100_000 / rows, run.cluster_cpu * 100_000 / rows
        body.append((run.name, run.seconds, rate, f"{ceiling.seconds / run.seconds:.2f}x", spark,
                     f"{run.spark_cpu / ceiling.spark_cpu:.2f}x" if ceiling.spark_cpu else "-", cluster))
    header = ("measurement", "seconds", "rows/s", "vs ceiling", "Spark CPU s/100k", "vs ceiling",
              "cluster CPU s/100k")
    return table(header, body)


def fit_table(line: Line, by_size: Mapping[int, Sequence[Batch]], ceiling_rate: float) -> str:
    """The per micro-batch and per row costs from the fit, then the median phases of the batches at each size."""
    per_row = line.slope / 1000  # the fit is in ms
    marginal = 1 / per_row if per_row > 0 else float("inf")
    summary = table(
        ("micro-batch cost (fit: ms = a + b * rows)", "value"),
        [
            ("a: fixed ms per micro-batch", line.intercept),
            ("b: us per row", line.slope * 1000),
            ("1/b: marginal rows/s", marginal),
            ("1/b vs ceiling", f"{marginal / ceiling_rate:.2f}x"),
            ("batches fitted", line.points),
        ],
    )
    rows = []
    for size, group in sorted(by_size.items()):
        medians = [percentile([b.phases[phase] for b in group], 0.5) for phase in PHASES]
        rows.append((f"{size:,} rows", len(group), percentile([b.ms for b in group], 0.5), *medians))
    phases = table(("micro-batch size", "batches", "median ms", *PHASES), rows)
    return f"{summary}\n\n{phases}"
