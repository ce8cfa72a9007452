"""The console commands say which extra to install when its packages are missing (a client-only install has the
commands' scripts but not their packages), and run the command otherwise."""

from __future__ import annotations

import importlib.util
import tomllib
from pathlib import Path
from typing import Any

import pytest

from waltz_common import entry

ROOT = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
IMPORT_NAMES = {"grpcio-health-checking": "grpc_health", "grpcio-reflection": "grpc_reflection", "pandas<3": "pandas"}


def test_every_command_goes_through_an_entry_that_checks_its_extra() -> None:
    for command, target in PROJECT["scripts"].items():
        module, _, name = target.partition(":")
        assert module == "waltz_common.entry" and callable(getattr(entry, name)), command


@pytest.mark.parametrize(("modules", "extra"), [(entry.SERVICE_MODULES, "server"), (entry.CLI_MODULES, "cli"),
                                                (entry.SPARK_MODULES, "spark")])
def test_the_checked_modules_are_the_extras_packages(modules: tuple[str, ...], extra: str) -> None:
    wanted = {IMPORT_NAMES.get(p, p) for p in PROJECT["optional-dependencies"][extra]} - {"grpcio-status"}
    assert set(modules) == wanted


def test_a_missing_package_names_the_extra_to_install(monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    real = importlib.util.find_spec

    def without_kazoo(name: str, *args: Any) -> Any:
        return None if name == "kazoo" else real(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", without_kazoo)
    assert entry.waltz_server() == 1
    assert capsys.readouterr().err == ("waltz-server: needs kazoo, which the plain install (the client alone) leaves "
                                       "out: pip install 'waltz-python[server]'\n")
    assert entry.waltz() == 1 and "pip install 'waltz-python[cli]'" in capsys.readouterr().err


def test_with_its_packages_the_command_runs(monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr("sys.argv", ["waltz"])
    assert entry.waltz() == 2  # the CLI itself: no command given prints its help and exits 2
    assert capsys.readouterr().out.startswith("usage: waltz")
