"""Which build runs (waltz_common.build_info): read from the checkout's git in an editable install, from the
_build.py that setup.py writes into a package built without .git (the Docker builds), and on every command's
--version."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

from waltz_common import build_info

ROOT = Path(__file__).resolve().parents[3]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
HEAD = build_info.git_commit(ROOT)

needs_git = pytest.mark.skipif(HEAD is None, reason="not a git checkout")


def test_the_version_carries_the_commit_as_a_local_label():
    build = build_info.BuildInfo("0.2.0", "26c72d7a1b2c3d4e5f60718293a4b5c6d7e8f901", dirty=True)
    assert build.version == "0.2.0+g26c72d7a1b2c.dirty"
    assert build_info.BuildInfo("0.2.0", "26c72d7a1b2c3d4e5f60718293a4b5c6d7e8f901").version == "0.2.0+g26c72d7a1b2c"
    assert build_info.BuildInfo("0.2.0", build_info.UNKNOWN).version == "0.2.0"
    assert build.line("waltz").startswith("waltz 0.2.0+g26c72d7a1b2c.dirty (commit 26c72d7a1b2c")


@needs_git
def test_a_checkout_reports_its_head():
    assert HEAD is not None
    build = build_info.resolve(ROOT)
    assert (build.source, build.commit, build.release) == ("git", HEAD[0], PROJECT["version"])


def test_without_git_or_a_build_stamp_it_falls_back_to_the_metadata(tmp_path: Path):
    build = build_info.resolve(tmp_path)
    assert build.source == "metadata" and build.commit == build_info.UNKNOWN
    assert build.version == PROJECT["version"]  # the editable install's metadata


@needs_git
@pytest.mark.parametrize("command", sorted(PROJECT["scripts"]))
def test_every_command_has_version(command: str):
    assert HEAD is not None
    script = Path(sys.executable).parent / command
    done = subprocess.run([str(script), "--version"], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"{command} {PROJECT['version']}+g{HEAD[0][:12]}")
    assert f"(commit {HEAD[0]}," in done.stdout


def test_a_package_built_without_git_carries_the_commit_given_to_the_build(tmp_path: Path):
    """As the Dockerfiles build it: the sources without .git, the commit as WALTZ_BUILD_COMMIT."""
    sources = tmp_path / "src"
    sources.mkdir()
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy(ROOT / name, sources / name)
    for tree in ("common", "services", "clients"):
        shutil.copytree(ROOT / tree, sources / tree, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    commit = "0123456789abcdef0123456789abcdef01234567"
    env = {**os.environ, "WALTZ_BUILD_COMMIT": commit}
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                           "--disable-pip-version-check", "-w", str(tmp_path / "dist"), str(sources)],
                          env=env, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    (wheel,) = (tmp_path / "dist").glob("*.whl")
    installed = tmp_path / "site"
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(installed)
    probe = subprocess.run(
        [sys.executable, "-c", "from waltz_common import build_info; b = build_info.current(); "
         "print(b.source, b.commit, b.version, build_info.__file__)"],
        env={**os.environ, "PYTHONPATH": str(installed)}, cwd=tmp_path, capture_output=True, text=True,
        timeout=60, check=False)
    assert probe.returncode == 0, probe.stderr
    source, found, version, where = probe.stdout.split()
    assert Path(where).is_relative_to(installed)
    assert (source, found, version) == ("build", commit, f"{PROJECT['version']}+g{commit[:12]}")
