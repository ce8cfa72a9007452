"""`waltz dev` as a newcomer uses it: start it, connect an application, tail | head, Ctrl-C, start again.

The application is examples/hello_waltz.py, run from this test process against the configuration
`waltz dev` printed. Stopping must leave no process behind (the services run in sessions of their
own, so the test finds them as children of `waltz dev`, and ZooKeeper by its pid file), and a
second run on the same --data directory must serve the same log.
"""

from __future__ import annotations

import importlib.util
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from waltz_cli.dev import READY_LINE
from waltz_common.testing.zookeeper import pid_alive

ROOT = Path(__file__).resolve().parents[3]
WALTZ = Path(sys.executable).parent / "waltz"
START_TIMEOUT = 120.0


def hello() -> ModuleType:
    spec = importlib.util.spec_from_file_location("hello_waltz", ROOT / "examples" / "hello_waltz.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Dev:
    """A running `waltz dev`: its process, what it printed, and the pids of what it started."""

    def __init__(self, *args: str) -> None:
        self.process = subprocess.Popen([str(WALTZ), "dev", *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                        text=True, bufsize=1)
        self.output: list[str] = []
        self.lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self.config: dict[str, Any] = {}

    def wait_ready(self) -> None:
        self.wait_for_line(READY_LINE)
        config_lines = [line for line in self.output if line.startswith(("client.servers:", "zookeeper.", "cluster."))]
        self.config = yaml.safe_load("\n".join(config_lines))
        self.admin = next(line.split()[2:4] for line in self.output if line.strip().startswith("admin "))

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def wait_for_line(self, wanted: str) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=1.0)
            except queue.Empty:
                continue
            if line is None:
                break
            self.output.append(line)
            if line.startswith(wanted):
                return
        raise AssertionError(f"waltz dev did not print {wanted!r}:\n" + "\n".join(self.output))

    def service_pids(self, data: Path) -> list[int]:
        """The storage nodes and servers (children of waltz dev) and ZooKeeper."""
        children = []
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == self.process.pid:
                children.append(int(stat.parent.name))
        pidfile = data / "zookeeper" / "zookeeper.pid"
        return [*children, *([int(pidfile.read_text())] if pidfile.exists() else [])]

    def stop(self, sig: signal.Signals) -> int:
        self.process.send_signal(sig)
        code = self.process.wait(timeout=90)
        while (line := self.lines.get(timeout=10)) is not None:
            self.output.append(line)
        return code


@pytest.fixture
def start() -> Iterator[Callable[..., Dev]]:
    """start(data, *args) runs `waltz dev --data data *args` until it is ready; at the end, whatever is
    still running is stopped: waltz dev by SIGTERM (it stops its services in order), then any service
    left by pid (found as its children, and ZooKeeper by its pid file, before the SIGTERM)."""
    started: list[tuple[Dev, Path]] = []

    def run(data: Path, *args: str) -> Dev:
        dev = Dev("--data", str(data), *args)
        started.append((dev, data))
        dev.wait_ready()
        return dev

    yield run
    for dev, data in started:
        if dev.process.poll() is not None:
            continue
        pids = dev.service_pids(data)
        dev.process.terminate()
        try:
            dev.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            dev.process.kill()
        for pid in pids:
            if pid_alive(pid):
                os.kill(pid, signal.SIGKILL)


@pytest.mark.slow
def test_waltz_dev_serves_an_application_stops_on_ctrl_c_and_keeps_its_data(tmp_path, start):
    data = tmp_path / "data"
    app = hello()

    dev = start(data, "--partitions", "1")
    pids = dev.service_pids(data)
    assert len(pids) == 5  # 3 storage nodes, a server, ZooKeeper
    assert list(dev.config) == ["client.servers"]  # an application needs the servers only, no ZooKeeper
    assert yaml.safe_load((data / "client.yaml").read_text()) == dev.config
    assert app.say_and_read(dev.config, ["one", "two"]) == [(0, b"one"), (1, b"two")]
    assert dev.admin == ["-c", str(data / "cli.yaml")]
    verify = subprocess.run([str(WALTZ), *dev.admin, "cluster", "verify"], capture_output=True, text=True,
                            timeout=60, check=False)
    assert verify.returncode == 0 and verify.stdout.rstrip().endswith("PASSED"), verify.stdout + verify.stderr

    # `waltz client tail | head` when head has gone: no BrokenPipeError, exit 0.
    read_end, write_end = os.pipe()
    os.close(read_end)
    tail = subprocess.run([str(WALTZ), "-c", str(data / "client.yaml"), "client", "tail", "-p", "0"],
                          stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=60, check=False)
    os.close(write_end)
    assert (tail.returncode, tail.stderr) == (0, "")

    assert dev.stop(signal.SIGINT) == 0, "\n".join(dev.output)
    assert dev.output[-1].startswith("waltz dev: stopped")
    assert [pid for pid in pids if pid_alive(pid)] == []

    again = start(data)  # the kept cluster: same storage ports, same log
    pids = again.service_pids(data)
    assert "starting the kept cluster" in again.output[0]
    assert app.say_and_read(again.config, ["three"]) == [(0, b"one"), (1, b"two"), (2, b"three")]
    assert again.stop(signal.SIGHUP) == 0, "\n".join(again.output)  # the terminal closed
    assert [pid for pid in pids if pid_alive(pid)] == []


def test_waltz_dev_refuses_a_directory_that_is_not_its_own(tmp_path):
    (tmp_path / "something").write_text("not a dev cluster")
    result = subprocess.run([str(WALTZ), "dev", "--data", str(tmp_path)], capture_output=True, text=True,
                            timeout=60, check=False)
    assert result.returncode == 1
    assert "neither empty nor a waltz dev data directory" in result.stderr
