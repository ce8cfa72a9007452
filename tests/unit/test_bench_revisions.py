"""bench.revisions (a baseline revision's checkout and environment, and its table read back into rows), and a small
run of bench.settle_bench.

The table is the one append_bench.format_report prints, so a change of its layout that the reader does not
follow fails here (the baseline revisions print the same layout)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from bench import revisions
from bench.append_bench import Report, WriterRow, format_report
from bench.baselines import Baselines


def _report(scale: float) -> Report:
    def cpu(total: float) -> dict[str, float]:
        return {"server": total * 0.4, "storage": total * 0.4, "clients": total * 0.2, "zookeeper": 0.0}

    writers = [
        WriterRow("1 writers", 1, 400 * scale, 0.002, 0.004, 0, cpu(2.0 / scale), batch=1.0),
        WriterRow("10 writers", 1, 3000 * scale, 0.003, 0.006, 0, cpu(0.4 / scale), batch=9.5),
        WriterRow("100 writers", 1, 15000 * scale, 0.006, 0.012, 0, cpu(0.08 / scale), batch=99.0),
        WriterRow("open loop 1,000/s", 1, 1000, 0.003, 0.0123, 0, cpu(0.3), 1000.0, 3.0),
    ]
    return Report(
        baselines=Baselines([0.0001] * 10, 50_000.0, [0.0002] * 10, 200_000.0),
        prefill_rate=20_000 * scale, prefill_count=1000, feed_raw=300_000.0, feed_client=120_000.0 * scale,
        feed_count=1000, writers=writers, peak={"server-0": 2**27}, log_size=1000,
    )


def test_a_table_reads_back_into_its_rows() -> None:
    rows = revisions.parse(format_report(_report(1.0), 1)).values
    assert rows["100 writers: committed/s"] == 15_000
    assert rows["10 writers: committed/s"] == 3_000
    assert rows["open loop 1,000/s: p99 ms"] == pytest.approx(12.3)
    assert rows["feed from 0: AsyncWaltzClient /s"] == 120_000
    assert rows["feed from 0: raw Stream /s"] == 300_000
    assert rows["prefill, appends/s"] == 20_000
    assert rows["CPU/1k 100 writers: total"] == pytest.approx(0.08)
    assert rows["CPU/1k 10 writers: server"] == pytest.approx(0.16)
    assert not any("zookeeper" in name for name in rows)


def test_compare_prints_every_run_and_the_ratio_of_the_means() -> None:
    base = [revisions.parse(format_report(_report(1.0), 1)) for _ in range(2)]
    cand = [revisions.parse(format_report(_report(s), 1)) for s in (1.4, 1.6)]
    lines = {line.split("  ")[0]: line for line in revisions.compare(base, cand, "baseline X", "Y").splitlines()}
    row = lines["100 writers: committed/s"]
    assert "15,000 / 15,000" in row and "21,000 / 24,000" in row
    assert row.split()[-1] == "1.50"
    assert lines["CPU/1k 100 writers: total"].split()[-1] == "0.67"  # 0.08 -> 0.0571 and 0.05: lower is better


def test_a_table_without_its_rows_is_refused() -> None:
    with pytest.raises(revisions.RevisionError, match="rows missing"):
        revisions.parse("load average: ...\nsomething else | entirely\n")


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout


def test_a_revision_is_exported_once_and_bootstrapped_by_its_own_script(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    _git(repo.parent, "init", "-q", str(repo))
    (repo / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    bootstrap = repo / "scripts" / "bootstrap"
    bootstrap.write_text('#!/bin/sh\nset -e\ncd "$(dirname "$0")/.."\nmkdir -p .venv/bin\n'
                         'ln -sf "$(command -v python3)" .venv/bin/python\necho run >> bootstrapped\n')
    bootstrap.chmod(0o755)
    _git(repo, "add", ".")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one")
    first = _git(repo, "rev-parse", "HEAD").strip()
    (repo / "pyproject.toml").write_text("[project]\nname = 'y'\n")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "two")

    cache = tmp_path / "cache"
    found = revisions.checkout("HEAD~1", cache, repo)
    assert found.commit == first and found.path == cache / first
    assert "name = 'x'" in (found.path / "pyproject.toml").read_text()  # the named revision, not the newest
    assert found.python.exists()
    again = revisions.checkout(first[:10], cache, repo)
    assert again.path == found.path
    assert (found.path / "bootstrapped").read_text().splitlines() == ["run", "run"]  # re-run: cheap, it updates
    assert _git(repo, "worktree", "list").count("\n") == 1  # the repository's worktrees are left alone

    with pytest.raises(revisions.RevisionError, match="does not know the revision"):
        revisions.checkout("no-such-branch", cache, repo)


def test_the_settle_benchmark_prints_both_ways_for_every_shape(capsys: pytest.CaptureFixture[str]) -> None:
    from bench import settle_bench

    assert settle_bench.main(["--appends", "2000", "--rounds", "1", "--batch", "50", "--clients", "2"]) == 0
    out = capsys.readouterr().out
    rows = [line.split("|") for line in out.splitlines() if line.count("|") == 2 and line.split()[0].isdigit()]
    assert [row[0].split() for row in rows] == [["50", "2"], ["10", "1"], ["100", "1"], ["100", "10"], ["500", "5"]]
    for _, costs, ratio in rows:
        assert all(float(x) > 0 for x in costs.split()) and float(ratio) > 0
