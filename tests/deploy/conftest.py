"""The container test's images are built before the first test runs (tests/deploy/images.py), with their own
budget and progress lines, outside pytest's per-test timeout; only when a selected test asks for them."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest

from tests.deploy import images as deploy_images

PREPARED = pytest.StashKey[deploy_images.Prepared]()
WORKDIR = pytest.StashKey[Path]()
NEEDS_IMAGES = "images"


def pytest_collection_finish(session: pytest.Session) -> None:
    if session.config.option.collectonly:
        return
    if not any(NEEDS_IMAGES in getattr(item, "fixturenames", ()) for item in session.items):
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")

    def say(line: str) -> None:
        if reporter is not None:
            reporter.write_line(f"tests/deploy: {line}")

    workdir = Path(tempfile.mkdtemp(prefix="waltz-deploy-"))
    session.config.stash[WORKDIR] = workdir
    session.config.stash[PREPARED] = deploy_images.prepare(workdir, say, deploy_images.budget())


def pytest_sessionfinish(session: pytest.Session) -> None:
    prepared = session.config.stash.get(PREPARED, None)
    if prepared is not None and prepared.engine is not None:
        prepared.engine.stop()
    workdir = session.config.stash.get(WORKDIR, None)
    if workdir is not None:
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture(scope="session")
def images(request: pytest.FixtureRequest) -> dict[str, str]:
    """Tags of the storage, server and (test-only) ZooKeeper images, built before the tests ran."""
    prepared = request.config.stash.get(PREPARED, None)
    if prepared is None:  # pytest_collection_finish did not see this test (never expected)
        pytest.fail("the images were not prepared before the tests (tests/deploy/conftest.py)")
    if prepared.unavailable:
        pytest.skip(f"no container engine can be started here: {prepared.unavailable}")
    if prepared.error:
        pytest.fail(prepared.error)
    return prepared.images
