"""The console scripts users type exist on PATH and answer --help."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BIN = Path(sys.executable).parent


@pytest.mark.parametrize("script", ["waltz-storage", "waltz-server", "waltz"])
def test_console_script_answers_help(script):
    result = subprocess.run([str(BIN / script), "--help"], capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    assert "usage:" in result.stdout
