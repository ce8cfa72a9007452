"""A fresh clone, with nothing beside it, passes the tests that could depend on files outside it.

Running the whole suite again inside the clone would double the suite's time, and bootstrapping
the clone would install every package again. So this test clones HEAD (what is committed) into an
empty temporary directory and runs there, with this checkout's .venv interpreter but PYTHONPATH
pointing at the clone's own sources (imports, and every process the tests start, then use the
clone's code; the test checks that they do), the tests that read files: the protocol contract
test, the generated-code check, the configuration reference check, the server's example config
check, the README check, and an import of the quick start. The static check that no tracked file
points beside the checkout is tests/unit/test_self_contained.py. Together they catch what made a
fresh clone fail before: a test reading documents from beside the checkout.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ("common", "services/storage", "services/server", "clients/python", ".")
FILE_READING_TESTS = (
    "tests/unit/test_protocol_contract.py",
    "tests/unit/test_generated_code.py",
    "tests/unit/test_config_docs.py",
    "tests/unit/server/test_server_config.py",
    "tests/unit/test_readme.py",
    "tests/unit/test_self_contained.py",
)


@pytest.mark.slow
def test_a_fresh_clone_passes_the_tests_that_read_files(tmp_path):
    if not (ROOT / ".git").exists() or shutil.which("git") is None:
        pytest.skip("not a git checkout: nothing to clone")
    empty = tmp_path / "empty"
    empty.mkdir()
    clone = empty / "waltz"
    subprocess.run(["git", "clone", "-q", "--no-hardlinks", str(ROOT), str(clone)], check=True, timeout=120,
                   capture_output=True)
    assert sorted(p.name for p in empty.iterdir()) == ["waltz"]  # nothing beside it
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(str(clone / s) for s in SOURCES)}
    env.pop("WALTZ_SEEDS", None)

    where = subprocess.run(
        [sys.executable, "-c", "import waltz_common, waltz_server, waltz_storage, waltz_client, waltz_cli, waltz;"
         "import waltz_common.testing.quickstart, waltz_client.demo.bank;"
         "print(*(m.__file__ for m in (waltz_common, waltz_server, waltz_storage, waltz_client, waltz_cli)))"],
        cwd=clone, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert where.returncode == 0, where.stderr
    assert all(Path(f).is_relative_to(clone) for f in where.stdout.split()), where.stdout

    # The clone says which commit it runs, read from its own git (waltz_build_info, --version).
    version = subprocess.run([sys.executable, "-m", "waltz_server.main", "--version"], cwd=clone, env=env,
                             capture_output=True, text=True, timeout=120, check=False)
    head = subprocess.run(["git", "-C", str(clone), "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=True, timeout=60).stdout.strip()
    assert version.returncode == 0 and f"+g{head[:12]} (commit {head}," in version.stdout, version

    tests = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *FILE_READING_TESTS],
        cwd=clone, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert tests.returncode == 0, tests.stdout[-4000:] + tests.stderr[-2000:]
    assert " passed" in tests.stdout and "skipped" not in tests.stdout, tests.stdout[-2000:]
