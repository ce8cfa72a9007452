"""Every ```python block of README.md and docs/*.md runs as written, so the examples cannot rot.

A block runs as a script of its own (this virtualenv's python, a fresh working directory) against a fresh local
cluster of one storage node and one server, whose `client.yaml` (as `waltz dev` writes it: client.servers) is in
the working directory. The addresses and paths the examples use for the reader's own deployment are mapped to
that cluster by PLACEHOLDERS, nothing else is changed. A block that can only be a fragment (a method, or code that
needs names the surrounding text defines) has the line `<!-- fragment -->` right before its fence: it is compiled
and type-checked with mypy instead, its undefined names taken as Any. Every block is type-checked.
"""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from waltz_common.testing.local_cluster import LocalCluster

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FRAGMENT = "<!-- fragment -->"


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # of the opening fence
    code: str
    fragment: bool

    @property
    def name(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def python_blocks() -> list[Block]:
    found = []
    for page in PAGES:
        lines = page.read_text().splitlines()
        for index, line in enumerate(lines):
            if line.strip() != "```python":
                continue
            end = next(i for i in range(index + 1, len(lines)) if lines[i].strip() == "```")
            code = textwrap.dedent("\n".join(lines[index + 1:end])) + "\n"
            fragment = index > 0 and lines[index - 1].strip() == FRAGMENT
            found.append(Block(page, index + 1, code, fragment))
    return found


BLOCKS = python_blocks()
RUNNABLE = [b for b in BLOCKS if not b.fragment]


@dataclass
class Place:
    """Where a block runs: the cluster's server and the working directory; a PostgreSQL database if it asks."""

    server: str
    workdir: Path
    postgres_dsn: Callable[[], str]


# What an example names for the reader's own deployment -> what stands for it here.
PLACEHOLDERS: dict[str, Callable[[Place], str]] = {
    '"/home/you/waltz-dev/client.yaml"': lambda place: repr(str(place.workdir / "client.yaml")),
    '"10.0.0.5:9091,10.0.0.6:9091"': lambda place: repr(place.server),
    '"postgresql://app@db.example:5432/orders"': lambda place: repr(place.postgres_dsn()),
}

# What the blocks that print should print (the block's print call -> a line of its output): checked, so that a
# block that runs but does nothing fails. A block that prints must have its entry here.
EXPECTED_OUTPUT = {
    "print(transaction.transaction_id, transaction.data())": "0 b'hello'",
    'print(callbacks.query_all("SELECT amount FROM orders WHERE id = %s", place.order["id"]))': "[(250,)]",
    "print(await client.high_water_mark(0))": "-1",
    'print(ledger.query_all("SELECT account, amount FROM entries"))': "[('alice', 10)]",
}


def test_the_pages_have_python_blocks_and_every_placeholder_is_used():
    assert len(RUNNABLE) >= 4 and any(b.fragment for b in BLOCKS)
    text = "".join(b.code for b in RUNNABLE)
    unused = [p for p in [*PLACEHOLDERS, *EXPECTED_OUTPUT] if p not in text]
    assert not unused, f"placeholders or expected outputs no runnable block uses any more: {unused}"


@pytest.mark.parametrize("block", RUNNABLE, ids=lambda b: b.name)
def test_the_block_runs_as_written(block: Block, tmp_path: Path, zookeeper: Any, cluster_root: str,
                                   request: pytest.FixtureRequest):
    workdir = tmp_path / "app"
    workdir.mkdir()
    with LocalCluster(tmp_path / "cluster", storage_nodes=1, servers=1, partitions=1,
                      zookeeper=zookeeper.connect_string, cluster_root=cluster_root) as cluster:
        server = cluster.servers[0].address
        (workdir / "client.yaml").write_text(yaml.safe_dump({"client.servers": server}))
        place = Place(server, workdir, lambda: str(request.getfixturevalue("postgres_dsn")))
        code = block.code
        for placeholder, value in PLACEHOLDERS.items():
            if placeholder in code:
                code = code.replace(placeholder, value(place))
        (workdir / "example.py").write_text(code)
        done = subprocess.run([sys.executable, "example.py"], cwd=workdir, capture_output=True, text=True,
                              timeout=120, check=False)
    assert done.returncode == 0, f"{block.name} failed:\n{done.stdout}\n{done.stderr[-4000:]}"
    expected = [line for call, line in EXPECTED_OUTPUT.items() if call in block.code]
    assert expected or "print(" not in block.code, f"{block.name} prints: say what in EXPECTED_OUTPUT"
    for line in expected:
        assert line in done.stdout.splitlines(), done.stdout


def test_every_block_compiles_and_type_checks(tmp_path: Path):
    """Fragments (and the blocks that run, too) through mypy with the project's settings; names a fragment takes
    from its surrounding text are Any (name-defined off), and examples may leave parameters unannotated."""
    files = []
    for index, block in enumerate(BLOCKS):
        compile(block.code, block.name, "exec")
        path = tmp_path / f"example_{index}.py"
        path.write_text(block.code)
        files.append(path)
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"), "--allow-untyped-defs",
         "--disable-error-code", "name-defined", "--no-error-summary", *map(str, files)],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=False,
    )
    names = {f"example_{i}.py": b.name for i, b in enumerate(BLOCKS)}
    report = re.sub(r"\S*(example_\d+\.py)", lambda m: names[m.group(1)], done.stdout)
    assert done.returncode == 0, report + done.stderr
