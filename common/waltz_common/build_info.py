"""Which Waltz this is: the version and the commit it was built from, for waltz_build_info and every command's
--version, so that during an upgrade each process says what it runs.

The first source found wins, resolved once per process:
1. the git checkout the package runs from (an editable install, or the sources on PYTHONPATH): the commit checked
   out now, which an editable install follows without reinstalling;
2. waltz_common/_build.py, which setup.py writes into a built package (pip install ., a wheel, the images): the
   commit the build came from, read from git, or from WALTZ_BUILD_COMMIT where the sources carry no .git (the
   Docker builds: .dockerignore leaves it out, the Dockerfiles take it as a build argument);
3. the distribution's metadata alone, with the commit "unknown".

The version is pyproject.toml's, with the commit as a PEP 440 local label (0.1.0+g26c72d7a1b2c, .dirty when the
checkout had uncommitted changes): two builds of one release number tell apart.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import importlib.metadata
import platform
import subprocess
import tomllib
from dataclasses import dataclass
from pathlib import Path

DISTRIBUTION = "waltz-python"
UNKNOWN = "unknown"
SHORT = 12
"""Hex digits of the commit in the version's local label."""
_CHECKOUT = Path(__file__).resolve().parents[2]
"""The repository's root when this file runs from a checkout (common/waltz_common/build_info.py)."""


@dataclass(frozen=True)
class BuildInfo:
    release: str  # pyproject.toml's version
    commit: str  # the full commit hash, or "unknown"
    dirty: bool = False  # built from a checkout with uncommitted changes
    source: str = "metadata"  # where the commit came from: git, build, metadata

    @property
    def version(self) -> str:
        if self.commit == UNKNOWN:
            return self.release
        return f"{self.release}+g{self.commit[:SHORT]}{'.dirty' if self.dirty else ''}"

    def line(self, command: str) -> str:
        """What `COMMAND --version` prints."""
        return f"{command} {self.version} (commit {self.commit}, Python {platform.python_version()})"


def git_commit(root: Path, timeout_s: float = 5.0) -> tuple[str, bool] | None:
    """(HEAD's hash, whether tracked files differ from it) of the checkout at root, or None where git cannot say."""
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "--verify", "HEAD"], capture_output=True,
                              text=True, timeout=timeout_s, check=False)
        if head.returncode != 0:
            return None
        status = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                                capture_output=True, text=True, timeout=timeout_s, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return head.stdout.strip(), status.returncode == 0 and bool(status.stdout.strip())


def _checkout_release(root: Path) -> str | None:
    """pyproject.toml's version when root is this project's checkout, else None."""
    try:
        project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    except (OSError, tomllib.TOMLDecodeError, KeyError):
        return None
    return str(project["version"]) if project.get("name") == DISTRIBUTION else None


def _metadata_release() -> str:
    try:
        return importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return UNKNOWN


def resolve(checkout: Path = _CHECKOUT) -> BuildInfo:
    """Find the build information (the module docstring's order); never raises."""
    release = _checkout_release(checkout)
    if release is not None and (checkout / ".git").exists():
        found = git_commit(checkout)
        if found is not None:
            return BuildInfo(release, found[0], found[1], "git")
    try:
        built = importlib.import_module("waltz_common._build")
    except ImportError:
        built = None
    if built is not None and getattr(built, "COMMIT", UNKNOWN) != UNKNOWN:
        return BuildInfo(str(built.RELEASE), str(built.COMMIT), bool(built.DIRTY), "build")
    return BuildInfo(release or _metadata_release(), UNKNOWN)


@functools.cache
def current() -> BuildInfo:
    """This process's build information, resolved on first use."""
    return resolve()


def version_line(command: str) -> str:
    return current().line(command)


class VersionAction(argparse.Action):
    """--version for a command's parser: prints version_line(prog) and exits, resolving the build only then."""

    def __init__(self, option_strings: list[str], dest: str = argparse.SUPPRESS, default: str = argparse.SUPPRESS,
                 help: str = "print the version and the commit it was built from, and exit") -> None:
        super().__init__(option_strings, dest, nargs=0, default=default, help=help)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: object,
                 option_string: str | None = None) -> None:
        print(version_line(parser.prog))
        parser.exit()


def add_version_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--version", action=VersionAction)
