"""Start and stop a standalone ZooKeeper on loopback through scripts/zookeeper-start and -stop."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[3]
SCRIPTS = REPO_ROOT / "scripts"


class ZooKeeperProcess:
    """A ZooKeeper server whose data and logs live in directory; usable as a context manager.

    port: the port to listen on (default: a free one). new_session: run it in a session of its own,
    out of reach of a terminal's Ctrl-C to whoever started it.
    """

    def __init__(self, directory: str | Path, port: int | None = None, new_session: bool = False) -> None:
        self.directory = Path(directory)
        self.port = port
        self.new_session = new_session
        self.connect_string = ""

    def start(self) -> str:
        """Start it (again: on the port and data of its last run, once it has run)."""
        command = [str(SCRIPTS / "zookeeper-start"), str(self.directory)]
        if self.port is not None:
            command.append(str(self.port))
        result = subprocess.run(
            command,
            check=False,
            start_new_session=self.new_session,
            capture_output=True,
            text=True,
            timeout=600,
        )
        if result.returncode != 0:
            raise RuntimeError(f"ZooKeeper did not start: {result.stderr.strip()}")
        self.connect_string = result.stdout.strip().splitlines()[-1]
        self.port = int(self.connect_string.rsplit(":", 1)[1])
        return self.connect_string

    def kill(self) -> None:
        """kill -9, as a crash: its data stays for a start() on the same port."""
        pid = self.pid
        if pid is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while pid_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.02)
        (self.directory / "zookeeper.pid").unlink(missing_ok=True)

    def pause(self) -> None:
        """SIGSTOP: frozen, its connections open and silent (a stop-the-world pause, a hung machine)."""
        self._signal(signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT after pause()."""
        self._signal(signal.SIGCONT)

    def _signal(self, sig: int) -> None:
        pid = self.pid
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)

    @property
    def pid(self) -> int | None:
        pidfile = self.directory / "zookeeper.pid"
        return int(pidfile.read_text()) if pidfile.exists() else None

    def stop(self) -> None:
        subprocess.run([str(SCRIPTS / "zookeeper-stop"), str(self.directory)], check=True, timeout=60)

    def __enter__(self) -> ZooKeeperProcess:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill 0; it is gone for our purposes once it is not running.
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"
