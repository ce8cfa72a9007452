"""The container test's images: a Docker engine (started here if none runs), the local base, and the ZooKeeper,
storage and server images built FROM it, within one budget of their own.

tests/deploy/conftest.py calls prepare() before the first test runs, outside pytest's per-test timeout (300 s):
on a fresh machine the base (debootstrap) and the images (pip installs) take minutes, more while other work keeps
the machine busy. The budget is WALTZ_IMAGE_BUILD_TIMEOUT seconds (default IMAGE_BUILD_BUDGET_S); each step
prints a line as it ends, so a slow build shows where it is.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tests.deploy import engine
from tests.deploy.chart import ROOT
from tests.deploy.engine import run
from waltz_common import build_info

IMAGE_BUILD_BUDGET_S = 2400.0
BUDGET_VARIABLE = "WALTZ_IMAGE_BUILD_TIMEOUT"


def budget() -> float:
    """The build budget in seconds: WALTZ_IMAGE_BUILD_TIMEOUT, or IMAGE_BUILD_BUDGET_S."""
    value = os.environ.get(BUDGET_VARIABLE, "")
    try:
        seconds = float(value) if value else IMAGE_BUILD_BUDGET_S
    except ValueError:
        raise ValueError(f"{BUDGET_VARIABLE}={value!r} is not a number of seconds") from None
    if seconds <= 0:
        raise ValueError(f"{BUDGET_VARIABLE} must be more than 0 seconds, not {value}")
    return seconds


@dataclass
class Prepared:
    """What prepare() left for the tests: the engine to stop at the end, the image tags, or why there are none."""

    engine: engine.Engine | None = None
    images: dict[str, str] = field(default_factory=dict)
    unavailable: str = ""  # no container engine here: the tests skip with this
    error: str = ""  # a build failed or overran the budget: the tests fail with this


def prepare(workdir: Path, say: Callable[[str], None], seconds: float) -> Prepared:
    """Start (or find) the engine and build every image within seconds; never raises."""
    prepared = Prepared()
    deadline = time.monotonic() + seconds
    started = time.monotonic()
    try:
        prepared.engine = engine.start_engine(workdir)
        say(f"building the container test's images (budget {seconds:.0f} s, {BUDGET_VARIABLE})")
        base = engine.base_image(timeout=remaining(deadline))
        say(f"base image {base} ready after {time.monotonic() - started:.0f} s")
        zk_file = ROOT / "tests/deploy/zookeeper.Dockerfile"
        zk_tag = f"waltz-test-zookeeper:{hashlib.sha256(zk_file.read_bytes() + base.encode()).hexdigest()[:12]}"
        if not engine.image_exists(zk_tag):
            build(zk_file, zk_tag, base, deadline)
        say(f"ZooKeeper image ready after {time.monotonic() - started:.0f} s")
        for component in ("storage", "server"):
            tag = f"waltz-{component}:test"
            build(ROOT / f"Dockerfile.{component}", tag, base, deadline)
            say(f"{tag} built after {time.monotonic() - started:.0f} s")
        prepared.images = {"storage": "waltz-storage:test", "server": "waltz-server:test", "zookeeper": zk_tag}
    except engine.EngineUnavailable as exc:
        prepared.unavailable = str(exc)
    except Exception as exc:
        prepared.error = f"building the images failed after {time.monotonic() - started:.0f} s " \
                         f"(budget {seconds:.0f} s, {BUDGET_VARIABLE}): {exc}"
    return prepared


def remaining(deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("the budget is spent")
    return left


def build(dockerfile: Path, tag: str, base: str, deadline: float) -> None:
    """Build an image; the Waltz images get the checkout's commit (.dockerignore leaves .git out of the context)."""
    commit = build_info.git_commit(ROOT)
    stamp = [] if commit is None else ["--build-arg", f"WALTZ_BUILD_COMMIT={commit[0]}",
                                       "--build-arg", f"WALTZ_BUILD_DIRTY={int(commit[1])}"]
    run(["docker", "build", "--network", "host", "-q", "-f", str(dockerfile), "--build-arg", f"BASE_IMAGE={base}",
         *stamp, "-t", tag, str(ROOT)], remaining(deadline))
