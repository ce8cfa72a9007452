"""What docs/operations.md tells an operator to run outside Kubernetes works as written: the shipped systemd units
(config/systemd/) start the commands this package installs with the settings the services honour, the ZooKeeper
unit's command forms an ensemble from config/zookeeper/zoo.cfg.example that survives the loss of a member, and
--log-file writes a log that logrotate can move."""

from __future__ import annotations

import configparser
import os
import re
import shlex
import signal
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest
from kazoo.client import KazooClient

from waltz_common.config import EXIT_CONFIG
from waltz_common.testing.local_cluster import LocalCluster, free_port

from .test_zookeeper import srvr

ROOT = Path(__file__).resolve().parents[2]
UNITS = ROOT / "config" / "systemd"
ZOO_EXAMPLE = ROOT / "config" / "zookeeper" / "zoo.cfg.example"


def read_unit(name: str) -> configparser.ConfigParser:
    unit = configparser.ConfigParser(interpolation=None, strict=False)
    unit.optionxform = str  # type: ignore[assignment,method-assign]  # systemd keys are case-sensitive
    unit.read_string((UNITS / name).read_text())
    return unit


def exec_start(unit: configparser.ConfigParser) -> list[str]:
    """ExecStart as systemd splits it: backslash-newline continues the line, $NAME takes the unit's Environment."""
    line = unit["Service"]["ExecStart"].replace("\\\n", " ")
    env = dict(item.split("=", 1) for item in shlex.split(unit["Service"].get("Environment", "")))
    return [env.get(word[1:], word) if word.startswith("$") else word for word in shlex.split(line)]


@pytest.mark.parametrize("name, command, config", [
    ("waltz-storage.service", "waltz-storage", "/etc/waltz/storage.yaml"),
    ("waltz-server.service", "waltz-server", "/etc/waltz/server.yaml"),
])
def test_waltz_units_run_the_installed_commands_with_what_the_services_honour(name, command, config):
    unit = read_unit(name)
    service = unit["Service"]
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert command in scripts
    assert exec_start(unit) == [f"/opt/waltz/bin/{command}", config]
    # A configuration error exits EXIT_CONFIG: restarting cannot fix it.
    assert service["RestartPreventExitStatus"] == str(EXIT_CONFIG)
    assert service["Restart"] == "on-failure"
    # SIGTERM is the graceful stop; systemd must wait longer than the grace period (10 s by default) before SIGKILL.
    assert service["KillSignal"] == "SIGTERM" and int(service["TimeoutStopSec"]) > 10
    assert unit["Install"]["WantedBy"] == "multi-user.target"


def test_the_zookeeper_unit_names_jars_that_debians_package_installs():
    command = exec_start(read_unit("waltz-zookeeper.service"))
    classpath = command[command.index("-cp") + 1].split(":")
    missing = [jar for jar in classpath if not Path(jar).is_file()]
    assert not missing, f"not installed by Debian's zookeeper package: {missing}"
    assert command[-2:] == ["org.apache.zookeeper.server.quorum.QuorumPeerMain", "/etc/waltz/zookeeper/zoo.cfg"]


def _mode(port: int) -> str | None:
    try:
        answer = srvr(port)
    except OSError:
        return None
    found = re.search(r"Mode: (\w+)", answer)
    return found.group(1) if found else None


@pytest.fixture
def ensemble(tmp_path: Path) -> Iterator[tuple[list[subprocess.Popen[bytes]], list[int]]]:
    """Three members started by the unit's own command on the example's settings, on loopback ports."""
    command = exec_start(read_unit("waltz-zookeeper.service"))
    client_ports = [free_port() for _ in range(3)]
    peers = "\n".join(f"server.{n}=127.0.0.1:{free_port()}:{free_port()}" for n in (1, 2, 3))
    example = ZOO_EXAMPLE.read_text()
    assert re.search(r"^server\.1=", example, re.M), "the example must show the ensemble's members"
    processes: list[subprocess.Popen[bytes]] = []
    try:
        for n, port in enumerate(client_ports, start=1):
            member = tmp_path / f"zk{n}"
            (member / "data").mkdir(parents=True)
            (member / "data" / "myid").write_text(f"{n}\n")
            config = re.sub(r"^server\.\d+=.*\n?", "", example, flags=re.M)
            config = re.sub(r"^dataDir=.*$", f"dataDir={member / 'data'}", config, flags=re.M)
            config = re.sub(r"^clientPort=.*$", f"clientPort={port}\nclientPortAddress=127.0.0.1", config, flags=re.M)
            (member / "zoo.cfg").write_text(config + peers + "\n")
            argv = [*command[:-1], str(member / "zoo.cfg")]
            argv = ["-Xmx128m" if word.startswith("-Xmx") else word for word in argv]
            with (member / "zookeeper.log").open("wb") as log:
                processes.append(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=member))
        yield processes, client_ports
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
            process.wait(timeout=30)


def _wait_for(predicate, timeout: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError(f"not within {timeout} s: {what}")


def test_the_example_ensemble_forms_a_quorum_and_survives_losing_a_member(ensemble):
    processes, ports = ensemble
    _wait_for(lambda: sorted(str(_mode(p)) for p in ports) == ["follower", "follower", "leader"], 90,
              "one leader and two followers")
    leader = next(i for i, p in enumerate(ports) if _mode(p) == "leader")
    processes[leader].send_signal(signal.SIGTERM)
    assert processes[leader].wait(timeout=30) in (0, 143, -signal.SIGTERM)
    rest = [p for i, p in enumerate(ports) if i != leader]
    _wait_for(lambda: sorted(str(_mode(p)) for p in rest) == ["follower", "leader"], 90, "a new leader of two")
    zk = KazooClient(hosts=",".join(f"127.0.0.1:{p}" for p in rest), timeout=30)
    zk.start(timeout=30)
    try:
        zk.create("/waltz/probe", b"written with one member down", makepath=True)
        assert zk.get("/waltz/probe")[0] == b"written with one member down"
    finally:
        zk.stop()
        zk.close()


def test_log_file_takes_the_log_and_is_reopened_after_logrotate_moves_it(tmp_path, zookeeper, cluster_root):
    local = LocalCluster(tmp_path / "cluster", storage_nodes=1, servers=0, partitions=1,
                         zookeeper=zookeeper.connect_string, cluster_root=cluster_root)
    with local:
        node = local.storage[0]
        assert node.stop(timeout=60) == 0
        log_file = tmp_path / "storage.log"
        node.command = [*node.command, "--log-file", str(log_file)]
        node.start()
        _wait_for(lambda: log_file.exists() and " INFO " in log_file.read_text(), 30, "INFO lines in the log file")
        os.rename(log_file, tmp_path / "storage.log.1")  # what logrotate does, without copytruncate or a signal
        assert node.stop(timeout=60) == 0
        output = node.new_log()
    assert "waltz-storage ready" in output  # the readiness line stays on stderr
    assert " INFO " not in output  # the log does not
    assert "shutting down" in log_file.read_text()  # written after the move: the handler reopened the path
    assert "shutting down" not in (tmp_path / "storage.log.1").read_text()


def test_an_unwritable_log_file_is_a_configuration_error(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "waltz_storage.main", str(tmp_path / "storage.yaml"),
         "--log-file", str(tmp_path / "no-such-directory" / "storage.log")],
        capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == EXIT_CONFIG
    assert "cannot open the log file" in done.stderr and "Traceback" not in done.stderr
