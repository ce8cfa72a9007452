"""setuptools' build with one step added: the built package carries waltz_common/_build.py, the commit it was
built from (waltz_common.build_info reads it where no git checkout is at hand). The commit comes from git, or from
WALTZ_BUILD_COMMIT (and WALTZ_BUILD_DIRTY=1) where the sources carry no .git, as in the Docker builds. The project's
metadata is all in pyproject.toml."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent


def _git(*args: str) -> str | None:
    try:
        done = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, timeout=30,
                              check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def build_commit() -> tuple[str, bool]:
    """(commit, dirty) of the sources being built; ("unknown", False) when neither git nor the environment says."""
    head = _git("rev-parse", "--verify", "HEAD") if (ROOT / ".git").exists() else None
    if head:
        return head, bool(_git("status", "--porcelain", "--untracked-files=no"))
    return os.environ.get("WALTZ_BUILD_COMMIT", "").strip() or "unknown", os.environ.get("WALTZ_BUILD_DIRTY") == "1"


class BuildPyWithCommit(build_py):
    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return  # an editable install reads the checkout's git at run time
        commit, dirty = build_commit()
        target = Path(self.build_lib) / "waltz_common" / "_build.py"
        target.write_text(
            '"""Written by setup.py when this package was built: the commit it came from."""\n\n'
            f"RELEASE = {self.distribution.get_version()!r}\nCOMMIT = {commit!r}\nDIRTY = {dirty!r}\n"
        )


setup(cmdclass={"build_py": BuildPyWithCommit})
