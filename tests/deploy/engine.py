"""A container engine for the deployment tests: dockerd started if need be, and a cached local base image.

No image registry is reachable from these machines, so the images are built FROM a Debian base made
here with debootstrap (python3, python3-venv, ca-certificates, and the host's extra CA certificates so
pip reaches PyPI through an intercepting proxy). The base is cached as a tarball keyed on what went
into it, and as a Docker image tag with the same key, so repeated runs only build the project layers.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

SUITE = "bookworm"
INCLUDE = "python3,python3-venv,ca-certificates"
HOST_CAS = Path("/usr/local/share/ca-certificates")
DOCKERD_FLAGS = ["--iptables=false", "--ip-masq=false", "--bridge=none", "--storage-driver=overlay2"]


class EngineUnavailable(Exception):
    """No container engine can be used here; the message says why (tests skip with it)."""


def run(args: list[str], timeout: float, check: bool = True, **kwargs: object) -> subprocess.CompletedProcess[str]:
    """Run a command, capturing text output; a failure raises with its stderr's tail."""
    done = subprocess.run(args, capture_output=True, text=True, timeout=timeout, check=False, **kwargs)  # type: ignore[call-overload]
    if check and done.returncode != 0:
        tail = (done.stderr or done.stdout)[-3000:]
        raise RuntimeError(f"{' '.join(args[:4])}... exited {done.returncode}: {tail}")
    return done


def docker_answers(timeout: float = 10) -> bool:
    """Whether `docker info` answers (an engine is running and reachable)."""
    if shutil.which("docker") is None:
        return False
    try:
        return run(["docker", "info"], timeout, check=False).returncode == 0
    except subprocess.TimeoutExpired:
        return False


@dataclass
class Engine:
    """A reachable Docker engine; `process` is set when this test run started dockerd (stop it with stop())."""

    process: subprocess.Popen[bytes] | None = None

    def stop(self) -> None:
        if self.process is None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)


def start_engine(workdir: Path, ready_timeout: float = 60) -> Engine:
    """An engine: the running one, or dockerd started here as root with flags that need no iptables or bridge."""
    if docker_answers():
        return Engine()
    if shutil.which("docker") is None or shutil.which("dockerd") is None:
        raise EngineUnavailable("no docker/dockerd binaries (Debian package docker.io)")
    if os.geteuid() != 0:
        raise EngineUnavailable("dockerd is not running and only root can start it")
    log = (workdir / "dockerd.log").open("wb")
    process = subprocess.Popen(["dockerd", *DOCKERD_FLAGS], stdout=log, stderr=subprocess.STDOUT)
    engine = Engine(process)
    deadline = time.monotonic() + ready_timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise EngineUnavailable(f"dockerd exited {process.returncode}: {_tail(workdir / 'dockerd.log')}")
        if docker_answers(timeout=5):
            return engine
        time.sleep(0.5)
    engine.stop()
    raise EngineUnavailable(f"dockerd did not answer within {ready_timeout}s: {_tail(workdir / 'dockerd.log')}")


def _tail(path: Path) -> str:
    return path.read_text(errors="replace")[-2000:]


def base_key() -> str:
    """What the base image is made of, hashed: the suite, the packages and the CA certificates put in."""
    digest = hashlib.sha256(f"{SUITE}|{INCLUDE}".encode())
    for cert in sorted(HOST_CAS.glob("*.crt")):
        digest.update(cert.name.encode() + cert.read_bytes())
    return digest.hexdigest()[:16]


def cache_dir() -> Path:
    root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return root / "waltz-deploy"


def image_exists(tag: str) -> bool:
    return run(["docker", "image", "inspect", tag], 30, check=False).returncode == 0


def base_image(timeout: float = 600) -> str:
    """The tag of the local Debian base, made with debootstrap and imported, both cached by base_key()."""
    tag = f"waltz-test-base:{base_key()}"
    if image_exists(tag):
        return tag
    tarball = cache_dir() / f"base-{base_key()}.tar"
    if not tarball.exists():
        if shutil.which("debootstrap") is None:
            raise EngineUnavailable("no debootstrap to make a base image (Debian package debootstrap)")
        make_rootfs_tarball(tarball, timeout)
    with tarball.open("rb") as stream:
        done = subprocess.run(["docker", "import", "-", tag], stdin=stream, capture_output=True, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"docker import failed: {done.stderr.decode(errors='replace')[-2000:]}")
    return tag


def make_rootfs_tarball(tarball: Path, timeout: float) -> None:
    """debootstrap a minimal Debian with Python, add the host's CA certificates, and tar it up."""
    tarball.parent.mkdir(parents=True, exist_ok=True)
    rootfs = tarball.parent / f"rootfs-{os.getpid()}"
    shutil.rmtree(rootfs, ignore_errors=True)
    try:
        run(["debootstrap", "--variant=minbase", f"--include={INCLUDE}", SUITE, str(rootfs)], timeout)
        target = rootfs / "usr/local/share/ca-certificates"
        target.mkdir(parents=True, exist_ok=True)
        for cert in HOST_CAS.glob("*.crt"):
            shutil.copy(cert, target / cert.name)
        run(["chroot", str(rootfs), "update-ca-certificates"], 120)
        shutil.rmtree(rootfs / "var/cache/apt/archives", ignore_errors=True)
        partial = tarball.with_suffix(".partial")
        run(["tar", "-C", str(rootfs), "-cf", str(partial), "."], timeout)
        partial.rename(tarball)
    finally:
        shutil.rmtree(rootfs, ignore_errors=True)
