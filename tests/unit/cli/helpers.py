"""Run the `waltz` CLI in-process and capture what it prints."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pytest

from waltz_cli.main import main


@dataclass
class Run:
    code: int
    out: str
    err: str

    def json(self) -> Any:
        return json.loads(self.out)


def waltz(capsys: pytest.CaptureFixture[str], *argv: str) -> Run:
    """main(argv) with stdout/stderr captured; never raises SystemExit."""
    capsys.readouterr()
    try:
        code = main(list(argv))
    except SystemExit as exc:
        code = int(exc.code or 0)
    captured = capsys.readouterr()
    return Run(code, captured.out, captured.err)
