"""The install a user follows: `scripts/dist` builds an sdist and a wheel; the wheel carries every package, the
PEP 561 markers and the client's dependency ranges, inside which constraints.txt pins. With WALTZ_SLOW=1 the
client is installed from the wheel into fresh virtualenvs at the lower bound of every range and at the newest
versions the ranges allow, and talks to a real local cluster from there (the README example's callbacks, a
commit, the feed, a metrics scrape)."""

from __future__ import annotations

import email
import os
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.version import Version

from waltz_common.testing.local_cluster import LocalCluster

ROOT = Path(__file__).resolve().parents[2]
SLOW = os.environ.get("WALTZ_SLOW") == "1"
PACKAGES = ("waltz", "waltz_common", "waltz_client", "waltz_cli", "waltz_server", "waltz_storage", "waltz_spark")

CLIENT_CHECK = """
import importlib.metadata as metadata, sys
from prometheus_client import CollectorRegistry, generate_latest
from waltz_client import WaltzClient
sys.path.insert(0, sys.argv[2])
from hello_waltz import Messages, Say

registry = CollectorRegistry()
messages = Messages()
with WaltzClient(messages, sys.argv[1], metrics_registry=registry) as client:
    assert client.submit_and_wait(Say("at the bounds"), timeout=30)
    assert messages.messages == [(0, b"at the bounds")], messages.messages
    assert "waltz_client_partition_mounted" in generate_latest(registry).decode()
for name in sys.argv[3:]:
    print(name, metadata.version(name))
"""


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("dist")
    done = subprocess.run([str(ROOT / "scripts/dist"), str(out)], capture_output=True, text=True, timeout=300,
                          check=False, env={**os.environ, "PYTHON": sys.executable})
    assert done.returncode == 0, done.stderr[-3000:]
    sdist, wheel = (Path(line) for line in done.stdout.split())
    return {"sdist": sdist, "wheel": wheel}


def client_requirements() -> list[Requirement]:
    project = __import__("tomllib").loads((ROOT / "pyproject.toml").read_text())["project"]
    return [Requirement(r) for r in project["dependencies"]]


def test_the_wheel_carries_every_package_its_markers_and_the_client_ranges(dist: dict[str, Path]):
    assert dist["wheel"].name == "waltz_python-0.1.0-py3-none-any.whl"
    with zipfile.ZipFile(dist["wheel"]) as wheel:
        names = wheel.namelist()
        [meta] = [n for n in names if n.endswith(".dist-info/METADATA")]
        metadata = email.message_from_bytes(wheel.read(meta))
    assert {n.split("/")[0] for n in names} >= set(PACKAGES)
    for marker in ("waltz/py.typed", "waltz_client/py.typed", "waltz_common/py.typed"):
        assert marker in names
    assert "waltz/v1/server_pb2_grpc.py" in names and "waltz_client/demo/bank.py" in names
    plain = {str(Requirement(r)) for r in metadata.get_all("Requires-Dist") if "extra ==" not in r}
    assert plain == {str(r) for r in client_requirements()}
    with tarfile.open(dist["sdist"]) as sdist:
        assert "waltz_python-0.1.0/pyproject.toml" in sdist.getnames()


def test_constraints_pin_the_client_inside_its_ranges():
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if "==" in line and not line.startswith("#"):
            name, version = line.split("==")
            pins[name.strip().lower().replace("_", "-")] = Version(version.strip())
    for requirement in client_requirements():
        pinned = pins[requirement.name.lower()]
        assert requirement.specifier.contains(pinned), f"constraints.txt pins {requirement.name} {pinned}"
        assert any(s.operator == ">=" for s in requirement.specifier) and any(
            s.operator == "<" for s in requirement.specifier), f"{requirement} is not a closed range"


def lower_bounds() -> list[str]:
    return [f"{r.name}=={next(s.version for s in r.specifier if s.operator == '>=')}" for r in client_requirements()]


@pytest.mark.slow
@pytest.mark.skipif(not SLOW, reason="installs from PyPI into two fresh virtualenvs (minutes): WALTZ_SLOW=1")
@pytest.mark.parametrize("bound", ["lower", "upper"])
def test_the_client_from_the_wheel_works_at_the_bounds_of_its_ranges(bound: str, dist: dict[str, Path],
                                                                     tmp_path: Path, zookeeper, cluster_root: str):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = str(venv / "bin/python")
    pins = lower_bounds() if bound == "lower" else []
    install = subprocess.run(
        [python, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--only-binary", ":all:",
         *(["--upgrade", "--upgrade-strategy", "eager"] if bound == "upper" else []), str(dist["wheel"]), *pins],
        capture_output=True, text=True, timeout=900, check=False)
    assert install.returncode == 0, install.stdout + install.stderr[-3000:]
    with LocalCluster(tmp_path / "cluster", storage_nodes=1, servers=1, partitions=1,
                      zookeeper=zookeeper.connect_string, cluster_root=cluster_root) as cluster:
        config = tmp_path / "client.yaml"
        config.write_text(yaml.safe_dump({"client.servers": cluster.servers[0].address}))
        names = [r.name for r in client_requirements()]
        done = subprocess.run([python, "-c", CLIENT_CHECK, str(config), str(ROOT / "examples"), *names],
                              capture_output=True, text=True, timeout=180, check=False, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    installed = dict(line.split() for line in done.stdout.splitlines())
    print(f"{bound}: {installed}")
    for requirement in client_requirements():
        version = Version(installed[requirement.name])
        assert requirement.specifier.contains(version)
        if bound == "lower":
            assert f"{requirement.name}=={version}" in lower_bounds()
