"""docs/configuration.md is what scripts/gen_config_docs.py makes of the code's key lists (never stale)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

from waltz_common.config import Key

ROOT = Path(__file__).resolve().parents[2]


def generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_config_docs", ROOT / "scripts" / "gen_config_docs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_configuration_reference_is_current():
    gen = generator()
    assert gen.main(["--check"]) == 0, "docs/configuration.md is stale: run .venv/bin/python scripts/gen_config_docs.py"
    text = (ROOT / "docs" / "configuration.md").read_text()
    for key in (*gen.ZOOKEEPER_KEYS, *gen.STORAGE_KEYS, *gen.server_keys(), *gen.CLIENT_KEYS):
        assert f"| `{key.name}` |" in text, key.name


def test_a_new_key_makes_the_check_fail(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]):
    gen = generator()
    monkeypatch.setattr(gen, "CLIENT_KEYS", (*gen.CLIENT_KEYS, Key("client.newKey", int, 1, "a key added later")))
    assert gen.main(["--check"]) == 1
    assert "docs/configuration.md is stale" in capsys.readouterr().err
    assert "| `client.newKey` | int | `1` | a key added later |" in gen.render()
