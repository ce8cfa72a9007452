"""Install what you use: the plain `pip install waltz-python` is the client alone, and it is enough.

The package is built as a wheel from this checkout and installed, with the versions of constraints.txt, into a new
virtualenv that sees nothing of this checkout or of .venv (no PYTHONPATH). The test checks that the virtualenv holds
the client's dependencies only (no kazoo, server, CLI, Spark or test packages), that examples/hello_waltz.py runs in
it against a real cluster (LocalCluster, found through client.servers), that `mypy --strict` of an application's
file finds the client's types there (py.typed), and that asking for ZooKeeper discovery, or running a command of an
extra (`waltz`, `waltz-server`), says which extra to install. The install takes about 40 s on the development
machine (from the local package index).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest
import yaml

from waltz_common.testing.local_cluster import LocalCluster
from waltz_common.testing.zookeeper import ZooKeeperProcess

ROOT = Path(__file__).resolve().parents[3]
CLIENT_DEPENDENCIES = {"grpcio", "protobuf", "pyyaml", "isal", "prometheus-client", "typing-extensions"}
"""What a client-only virtualenv holds besides waltz-python, pip and setuptools (typing-extensions: grpcio's)."""
NOT_FOR_CLIENTS = ("kazoo", "uvloop", "cryptography", "tqdm", "psutil", "grpcio-health-checking", "pyspark",
                   "pytest", "psycopg", "grpcio-tools")

APPLICATION = """\
from waltz_client import Transaction, TransactionBuilder, TransactionContext, WaltzClient, WaltzClientCallbacks


class Callbacks(WaltzClientCallbacks):
    def get_client_high_water_mark(self, partition_id: int) -> int:
        return -1

    def apply_transaction(self, transaction: Transaction) -> None:
        print(transaction.transaction_id)

    def uncaught_exception(self, partition_id: int, transaction_id: int, exc: BaseException) -> None:
        print(exc)


class Say(TransactionContext):
    def partition_id(self, num_partitions: int) -> int:
        return 0

    def execute(self, builder: TransactionBuilder) -> bool:
        builder.set_data(b"hello")
        return True


def main() -> None:
    with WaltzClient(Callbacks(), {"client.servers": "127.0.0.1:1"}) as client:
        committed: bool = client.submit_and_wait(Say(), timeout=30)
        wrong: str = client.submit_and_wait(Say())  # the one error mypy must find
        print(committed, wrong)
"""


def _clean_env() -> dict[str, str]:
    """This process's environment without what would let the virtualenv see this checkout or .venv."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV") and not k.startswith("WALTZ_")}
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep)
                                  if not p.startswith(str(Path(sys.executable).parent)))
    return env


def _run(args: list[str | Path], cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(a) for a in args], cwd=cwd, env=_clean_env(), capture_output=True, text=True,
                          timeout=timeout, check=False)


def _size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink())


@pytest.mark.slow
def test_a_client_only_virtualenv_runs_hello_waltz_against_a_cluster(
        tmp_path: Path, zookeeper: ZooKeeperProcess) -> None:
    # Build from a copy of the sources: nothing of a build/ directory left in the checkout gets in.
    src = tmp_path / "src"
    for part in ("common", "services", "clients"):
        shutil.copytree(ROOT / part, src / part, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                            "-w", str(tmp_path / "wheel"), str(src)], capture_output=True, text=True, timeout=300,
                           check=False)
    assert built.returncode == 0, built.stderr
    wheel = next((tmp_path / "wheel").glob("waltz_python-*.whl"))

    venv = tmp_path / "venv"
    python = venv / "bin" / "python"
    made = _run([sys.executable, "-m", "venv", venv], tmp_path)
    assert made.returncode == 0, made.stderr
    installed = _run([python, "-m", "pip", "install", "-q", "-c", ROOT / "constraints.txt", wheel], tmp_path, 600)
    assert installed.returncode == 0, installed.stdout + installed.stderr
    listed = _run([python, "-m", "pip", "list", "--format", "json"], tmp_path)
    packages = {p["name"].lower().replace("_", "-"): p["version"] for p in json.loads(listed.stdout)}
    assert set(packages) - {"pip", "setuptools", "waltz-python"} == CLIENT_DEPENDENCIES, packages
    assert not [p for p in NOT_FOR_CLIENTS if p in packages]
    site = next((venv / "lib").glob("python3*/site-packages"))
    dependencies = {p: v for p, v in sorted(packages.items()) if p not in ("pip", "setuptools")}
    print(f"client-only virtualenv: {_size(venv) / 1e6:.0f} MB in all, {_size(site) / 1e6:.0f} MB of site-packages "
          f"(pip and setuptools: {(_size(site / 'pip') + _size(site / 'setuptools')) / 1e6:.0f} MB); "
          f"installed: {dependencies}")

    with LocalCluster(tmp_path / "cluster", storage_nodes=1, servers=1, partitions=1,
                      cluster_root=f"/test/{uuid.uuid4().hex[:12]}", zookeeper=zookeeper.connect_string) as cluster:
        config = tmp_path / "client.yaml"
        config.write_text(yaml.safe_dump({"client.servers": cluster.servers[0].address}))
        hello = _run([python, ROOT / "examples" / "hello_waltz.py", config, "hello", "world"], tmp_path, 120)
        assert hello.returncode == 0, hello.stdout + hello.stderr
        assert [line.split(maxsplit=1) for line in hello.stdout.splitlines()] == [["0", "hello"], ["1", "world"]]

    where = _run([python, "-c", "import sys, waltz_client; print(waltz_client.__file__); "
                  "print(sorted(m for m in sys.modules if m.split('.')[0] in ('kazoo', 'waltz_server', 'waltz_cli')))"],
                 tmp_path)
    assert where.stdout.splitlines() == [str(site / "waltz_client" / "__init__.py"), "[]"], where.stdout + where.stderr

    zk_only = _run([python, "-c", "from waltz_client import WaltzClient, ConfigError\n"
                    "try:\n    WaltzClient(None, {'zookeeper.connectString': 'h:1', 'cluster.root': '/w'})\n"
                    "except ConfigError as exc:\n    print(exc)"], tmp_path)
    wheel_hint = f"pip install '{wheel}[zookeeper]'"  # the wheel this virtualenv was installed from: a true hint
    assert wheel_hint in zk_only.stdout, zk_only.stdout + zk_only.stderr

    for command, extra in (("waltz", "cli"), ("waltz-server", "server")):  # installed, but not their packages
        refused = _run([venv / "bin" / command, "--help"], tmp_path)
        assert refused.returncode == 1 and f"pip install '{wheel}[{extra}]'" in refused.stderr, refused.stderr

    application = tmp_path / "application.py"
    application.write_text(textwrap.dedent(APPLICATION))
    mypy = shutil.which("mypy", path=str(Path(sys.executable).parent)) or "mypy"
    typed = _run([mypy, "--strict", "--no-incremental", "--python-executable", python, application], tmp_path)
    errors = [line for line in typed.stdout.splitlines() if ": error:" in line]
    assert len(errors) == 1 and 'expression has type "bool", variable has type "str"' in errors[0], typed.stdout
