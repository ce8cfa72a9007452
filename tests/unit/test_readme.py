"""The README stays short and true: its first commands, its example (run against the mock server), its links."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

import waltz_client
from waltz_client import MockServer

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()


def blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", README, flags=re.S)


def test_the_two_commands_come_first_and_the_readme_stays_short():
    assert blocks("bash")[0].split() == ["./scripts/quickstart", "./scripts/test"]
    assert len(README.splitlines()) <= 200


def test_the_client_example_runs(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]):
    real = waltz_client.WaltzClient

    def on_the_mock(callbacks: Any, config: Any) -> Any:
        assert str(config).endswith("client.yaml")  # the file `waltz dev` writes
        return real(callbacks, driver=MockServer(1))

    monkeypatch.setattr(waltz_client, "WaltzClient", on_the_mock)
    exec(compile(blocks("python")[0], "README.md", "exec"), {})
    assert "0 b'hello'" in capsys.readouterr().out


def test_every_local_link_leads_to_a_file():
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        links = re.findall(r"\]\(([^)#]+)", page.read_text())
        missing = {link for link in links if not link.startswith("http") and not (page.parent / link).exists()}
        assert not missing, (page.name, missing)
