"""A Spark standalone cluster started by hand on loopback: one master, one worker, free ports, its own dirs.

The master and the worker are the JVM classes Spark's sbin scripts start (pip's pyspark ships the jars, not the
scripts that use them); each runs in its own process group and is stopped by its pid.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType

import pyspark

SPARK_HOME = Path(pyspark.__file__).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def scala_version() -> str:
    """The Scala version of the pip package's jars (spark-core_2.13-4.x.jar: 2.13)."""
    core = next((SPARK_HOME / "jars").glob("spark-core_*.jar"))
    return core.name.removeprefix("spark-core_").split("-", 1)[0]


class StandaloneSpark:
    """spark://127.0.0.1:<port> with one worker of `cores` cores; logs and work dirs under `directory`."""

    def __init__(self, directory: Path, cores: int = 2, memory: str = "1g", timeout_s: float = 60.0) -> None:
        self.directory = directory
        self.cores, self.memory, self.timeout_s = cores, memory, timeout_s
        self.port = free_port()
        self.processes: list[subprocess.Popen[bytes]] = []

    @property
    def master(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    def env(self) -> dict[str, str]:
        """The environment the master, the worker and its executors (and a driver) run with."""
        return {
            **os.environ,
            "SPARK_HOME": str(SPARK_HOME),
            # the worker's executor launcher looks for a build directory unless it is told the Scala version
            "SPARK_SCALA_VERSION": scala_version(),
            "SPARK_LOCAL_IP": "127.0.0.1",
            "SPARK_LOG_DIR": str(self.directory / "logs"),
            "PYSPARK_PYTHON": sys.executable,  # the executors' Python workers need this project and pyarrow
        }

    def _start(self, name: str, *args: str) -> Path:
        log = self.directory / f"{name}.log"
        command = ["java", "-Xmx512m", "-cp", f"{SPARK_HOME / 'jars'}/*", *args]
        with log.open("wb") as out:
            self.processes.append(
                subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=self.env(), start_new_session=True)
            )
        return log

    def _wait_for(self, log: Path, text: str) -> None:
        deadline = time.monotonic() + self.timeout_s
        while text not in log.read_text(errors="replace"):
            if any(p.poll() is not None for p in self.processes) or time.monotonic() > deadline:
                raise RuntimeError(f"{log.name} never said {text!r}:\n{log.read_text(errors='replace')[-3000:]}")
            time.sleep(0.2)

    def start(self) -> StandaloneSpark:
        (self.directory / "work").mkdir(parents=True, exist_ok=True)
        try:
            master = self._start(
                "master",
                "org.apache.spark.deploy.master.Master",
                "--host", "127.0.0.1", "--port", str(self.port), "--webui-port", str(free_port()),
            )  # fmt: skip
            self._wait_for(master, "I have been elected leader")
            worker = self._start(
                "worker",
                "org.apache.spark.deploy.worker.Worker",
                "--host", "127.0.0.1", "--webui-port", str(free_port()),
                "--cores", str(self.cores), "--memory", self.memory,
                "--work-dir", str(self.directory / "work"),
                self.master,
            )  # fmt: skip
            self._wait_for(worker, "Successfully registered with master")
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        for process in reversed(self.processes):  # the worker (and its executors, its group) first
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
                try:
                    process.wait(15)
                except subprocess.TimeoutExpired:
                    os.killpg(process.pid, signal.SIGKILL)
                    process.wait()
        self.processes.clear()

    def __enter__(self) -> StandaloneSpark:
        return self.start()

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.stop()
