"""The README's first command runs from a clean checkout: cluster up, demo consistent, all stopped."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("extra", [[], ["--tls"]], ids=["plaintext", "tls"])
def test_quickstart_runs_the_demo_and_stops_everything(tmp_path, extra):
    result = subprocess.run(
        [str(ROOT / "scripts" / "quickstart"), "--transactions", "80", "--clients", "3", "--workdir", str(tmp_path),
         *extra],
        capture_output=True, text=True, timeout=600, check=False,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    assert "consistency: OK" in output
    assert "quickstart: done; everything stopped" in output
    assert ("mutual TLS; certificates in" in output) == bool(extra)
    leftover = subprocess.run(["pgrep", "-f", str(tmp_path)], capture_output=True, text=True, check=False)
    assert leftover.stdout.strip() == "", f"processes left behind: {leftover.stdout}"
