"""Nothing in the repository reads the design documents or anything else beside the checkout.

The project is built from documents kept beside it (in a directory named shared); a fresh
clone has nothing beside it, so no tracked file may point there, as a path string or as a path
built from pieces (the parent directory / the name shared / the name seeds).
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# Spelled in pieces, so that this file does not match itself.
NAME = "sha" + "red"
OUTSIDE = ("../" + NAME, NAME + "/seeds", "/work/" + NAME)
PIECE = re.compile(r"""["']""" + NAME + r"""["']""")


def tracked_files() -> list[Path]:
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: no list of tracked files")
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True, timeout=60)
    return [ROOT / name for name in listed.stdout.decode().split("\0") if name]


def test_no_tracked_file_points_beside_the_checkout():
    offenders = []
    for path in tracked_files():
        try:
            text = path.read_text(errors="replace")
        except (IsADirectoryError, FileNotFoundError):
            continue
        offenders += [f"{path.relative_to(ROOT)}: {needle}" for needle in OUTSIDE if needle in text]
        offenders += [f"{path.relative_to(ROOT)}: {match}" for match in PIECE.findall(text)]
    assert offenders == []
