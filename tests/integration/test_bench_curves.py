"""Smoke run of every bench.curves module in its --quick form: each prints its table, its baseline and the load
average, and stops what it started. Figures are never asserted here (speed is measured in bench/, not tests)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import psutil
import pytest

from bench.curves import consumers, etcd, failover, log_size, memory, offered_load, partitions

pytestmark = pytest.mark.slow

CURVES = {
    "memory": (memory, ["1 partition", "16 partitions", "growth - churn <= budget", "a server owning no partition"]),
    "offered_load": (offered_load, ["1,000/s offered", "10,000/s offered", "p99.9 ms", "baselines (same run)"]),
    "partitions": (partitions, ["1 partition, 1 server", "4 partitions, 2 servers", "16 partitions, 2 servers",
                                "slowest share"]),
    "consumers": (consumers, ["1 consumer", "10 consumers", "50 consumers", "server CPU us/delivered"]),
    "log_size": (log_size, ["storage node, empty log (baseline)", "storage node, 100,000 records",
                            "server takeover, 100,000 transactions"]),
    "failover": (failover, ["failure detector (default): kill -9", "failure detector (default): SIGSTOP 10 s",
                            "old: session expiry only", "signal to session expiry s"]),
    "etcd": (etcd, ["etcd 3.4, 3 members", "Waltz: 100 writers", "x etcd"]),
}


# The suite's default run smokes the two shortest (about 40 s in all); WALTZ_SLOW=1 runs every curve (about
# 6 min more), as the benchmark's own --quick runs do. failover's quick form holds SIGSTOPs of 10 s and waits out
# 6 s sessions, twice each (3 min): tests/chaos/test_failover.py covers the detector in the default suite.
DEFAULT = {"consumers", "log_size"}


@pytest.mark.parametrize("name", sorted(CURVES))
def test_the_quick_form_prints_its_table(name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    if name not in DEFAULT and os.environ.get("WALTZ_SLOW") != "1":
        pytest.skip("a longer curve: its smoke run is part of WALTZ_SLOW=1")
    module, expected = CURVES[name]
    if module is etcd and not all(shutil.which(p) for p in ("etcd", "etcdctl", "go")):
        pytest.skip(f"etcd side by side needs: apt-get install {etcd.PACKAGES}")
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    assert module.main(["--quick", "--dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("load average (1 min): start "), out
    for text in expected:
        assert text in out, f"{text!r} missing from:\n{out}"
    left = [p for p in psutil.Process().children(recursive=True) if p.pid not in before and p.is_running()
            and p.status() != psutil.STATUS_ZOMBIE and "resource_tracker" not in " ".join(p.cmdline())]
    assert not left, f"processes left running: {[p.cmdline() for p in left]}"
