"""Every ```python block of README.md and docs/*.md runs as written, so the examples cannot rot.

A block runs as a script of its own (this virtualenv's python, a fresh working directory) against a fresh local
cluster of one storage node and one server, whose `client.yaml` (as `waltz dev` writes it: client.servers) is in
the working directory. The addresses and paths the examples use for the reader's own deployment are mapped to
that cluster by PLACEHOLDERS, nothing else is changed. A block that can only be a fragment (a method, or code that
needs names the surrounding text defines) has the line `<!-- fragment -->` right before its fence: it is compiled
and type-checked with mypy instead, its undefined names taken as Any. Every block is type-checked.
WALTZ_CLIENT_CONFIG names that `client.yaml`, so a block may make its client with no configuration.

A web application's block (an ASGI `app`) has `<!-- serve: GET /ready, POST /notes?text=hello -->` before its
fence: it is served by uvicorn (`uvicorn example:app`) instead of run; the first request is made until it
answers 200 (the application caught up), each next one must answer 200 at once, and then SIGTERM must stop the
server with its lifespan's shutdown complete.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.request
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
SERVE = re.compile(r"<!-- serve: (.+) -->")


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # of the opening fence
    code: str
    fragment: bool
    serve: tuple[tuple[str, str], ...] = ()  # (method, path) of each request to a served application

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
            serve = SERVE.fullmatch(lines[index - 1].strip()) if index > 0 else None
            requests = tuple((m, path) for m, path in (r.split() for r in serve.group(1).split(", "))) if serve else ()
            found.append(Block(page, index + 1, code, fragment, requests))
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
        env = {**os.environ, "WALTZ_CLIENT_CONFIG": str(workdir / "client.yaml")}
        if block.serve:
            serve(block, workdir, env)
            return
        done = subprocess.run([sys.executable, "example.py"], cwd=workdir, capture_output=True, text=True,
                              timeout=120, check=False, env=env)
    assert done.returncode == 0, f"{block.name} failed:\n{done.stdout}\n{done.stderr[-4000:]}"
    expected = [line for call, line in EXPECTED_OUTPUT.items() if call in block.code]
    assert expected or "print(" not in block.code, f"{block.name} prints: say what in EXPECTED_OUTPUT"
    for line in expected:
        assert line in done.stdout.splitlines(), done.stdout


def serve(block: Block, workdir: Path, env: dict[str, str]) -> None:
    """Serve the block's `app` with uvicorn, make its requests, then stop it with SIGTERM."""
    from waltz_common.testing.local_cluster import free_port

    port = free_port()
    log = workdir / "uvicorn.log"
    with log.open("wb") as out:
        server = subprocess.Popen([sys.executable, "-m", "uvicorn", "--port", str(port), "example:app"], cwd=workdir,
                                  env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        for index, (method, path) in enumerate(block.serve):
            deadline = time.monotonic() + (60 if index == 0 else 0)
            while True:
                status = _request(method, f"http://127.0.0.1:{port}{path}")
                if status == 200 or time.monotonic() >= deadline:
                    break
                assert server.poll() is None, log.read_text()
                time.sleep(0.2)
            assert status == 200, f"{block.name}: {method} {path} answered {status}\n{log.read_text()[-4000:]}"
        server.send_signal(signal.SIGTERM)
        server.wait(30)
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    assert "Application shutdown complete" in log.read_text(), log.read_text()[-4000:]


def _request(method: str, url: str) -> int | None:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, method=method), timeout=30) as response:
            json.loads(response.read())
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return None  # not listening yet


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
