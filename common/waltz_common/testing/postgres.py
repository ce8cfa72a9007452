"""Start and stop a throwaway PostgreSQL server (initdb + pg_ctl) on a loopback port, for tests.

PostgreSQL refuses to run as root, so when this process is root the server runs as an unprivileged
system user (`postgres`, which Debian's package creates, else `nobody`) through runuser. Its data
directory and unix socket live in a temporary directory of their own (not under pytest's, which
root keeps private), removed by stop().
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from waltz_common.testing.local_cluster import free_port

SUPERUSER = "waltz"


def postgres_bin_dir() -> Path:
    """The directory of Debian's PostgreSQL server programs (the newest version installed)."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(Path(p).parts[4]))
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    if initdb:
        return Path(initdb).resolve().parent
    raise RuntimeError("PostgreSQL is not installed (initdb not found): run scripts/bootstrap, which installs "
                       "Debian's postgresql package")


def _run_as_user() -> str | None:
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        try:
            pwd.getpwnam(name)
            return name
        except KeyError:
            continue
    raise RuntimeError("running as root and neither a 'postgres' nor a 'nobody' user exists to run PostgreSQL")


class PostgresProcess:
    """A PostgreSQL server for one test session: `with PostgresProcess() as pg: pg.dsn(...)`."""

    def __init__(self) -> None:
        self.bin_dir = postgres_bin_dir()
        self.user = _run_as_user()
        self.port = 0
        self.directory: Path | None = None
        self.pid: int | None = None

    @property
    def data_dir(self) -> Path:
        assert self.directory is not None, "start() first"
        return self.directory / "data"

    def dsn(self, database: str = "postgres") -> str:
        """A libpq connection URI for database over TCP on loopback."""
        return f"postgresql://{SUPERUSER}@127.0.0.1:{self.port}/{database}"

    def _command(self, *argv: str) -> list[str]:
        return ["runuser", "-u", self.user, "--", *argv] if self.user else list(argv)

    def _run(self, *argv: str, timeout: float = 120.0) -> None:
        result = subprocess.run(self._command(*argv), capture_output=True, text=True, timeout=timeout,
                                stdin=subprocess.DEVNULL, check=False)
        if result.returncode != 0:
            raise RuntimeError(f"{Path(argv[0]).name} failed ({result.returncode}): "
                               f"{(result.stderr or result.stdout).strip()[-2000:]}")

    def start(self) -> str:
        """initdb a fresh cluster, start it and wait until it accepts connections; its DSN."""
        self.directory = Path(tempfile.mkdtemp(prefix="waltz-postgres-"))
        try:
            if self.user:
                entry = pwd.getpwnam(self.user)
                os.chown(self.directory, entry.pw_uid, entry.pw_gid)
            self._run(str(self.bin_dir / "initdb"), "-D", str(self.data_dir), "-U", SUPERUSER, "--auth=trust",
                      "-E", "UTF8", "--no-sync", "--locale=C")
            self.port = free_port()
            # fsync off: these servers hold test data only (what is tested is the helper's
            # transactions, not PostgreSQL's durability), and the machine's disk is shared
            options = (f"-p {self.port} -h 127.0.0.1 -k {self.directory} -c fsync=off -c full_page_writes=off "
                       "-c max_connections=100")
            log = self.directory / "postgres.log"
            self._run(str(self.bin_dir / "pg_ctl"), "-D", str(self.data_dir), "-l", str(log), "-o", options,
                      "-w", "-t", "60", "start")
            self.pid = int((self.data_dir / "postmaster.pid").read_text().split()[0])
        except BaseException:
            self.stop()
            raise
        return self.dsn()

    def log(self) -> str:
        path = self.directory / "postgres.log" if self.directory else None
        return path.read_text(errors="replace") if path and path.exists() else ""

    def stop(self) -> None:
        """Stop the server (fast shutdown, then SIGKILL of its pid) and remove its directory."""
        if self.directory is None:
            return
        if self.pid is not None:
            try:
                self._run(str(self.bin_dir / "pg_ctl"), "-D", str(self.data_dir), "-m", "fast", "-w", "-t", "30",
                          "stop", timeout=60)
            except (RuntimeError, subprocess.TimeoutExpired):
                _kill(self.pid)
            self.pid = None
        shutil.rmtree(self.directory, ignore_errors=True)
        self.directory = None

    def __enter__(self) -> PostgresProcess:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _kill(pid: int) -> None:
    try:
        os.kill(pid, 9)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
