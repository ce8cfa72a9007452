"""The generated code under common/waltz/v1 matches protos/ (never edited by hand)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_generated_code_is_fresh_and_protoc_is_silent():
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gen_protos.py"), "--check"],
        capture_output=True, text=True, check=False, timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr == "", f"protoc printed warnings: {result.stderr}"
