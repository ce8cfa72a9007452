"""The console commands say which extra to install when its packages are missing (a client-only install has the
commands' scripts but not their packages), and run the command otherwise."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
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
                                       f"out: pip install -e '{ROOT}[server]'\n")  # this checkout, as installed
    assert entry.waltz() == 1 and f"pip install -e '{ROOT}[cli]'" in capsys.readouterr().err


class _Installed:
    """A distribution as importlib.metadata shows one, with pip's record of where it came from (PEP 610)."""

    def __init__(self, direct_url: dict[str, Any] | None) -> None:
        self.direct_url = direct_url
        self.version = "0.1.0"

    def read_text(self, name: str) -> str | None:
        return json.dumps(self.direct_url) if name == "direct_url.json" and self.direct_url is not None else None


@pytest.mark.parametrize(("direct_url", "wanted"), [
    ({"url": f"file://{ROOT}", "dir_info": {"editable": True}}, f"pip install -e '{ROOT}[cli]'"),
    ({"url": f"file://{ROOT}", "dir_info": {}}, f"pip install '{ROOT}[cli]'"),
    ({"url": "file://WHEEL", "archive_info": {}}, "pip install 'WHEEL[cli]'"),
    ({"url": "file:///gone/waltz_python-0.1.0-py3-none-any.whl", "archive_info": {}}, "GENERIC"),
    (None, "GENERIC"),  # installed from an index mirror, or pip recorded nothing
])
def test_the_install_hint_names_where_this_install_came_from(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                             direct_url: dict[str, Any] | None, wanted: str) -> None:
    wheel = tmp_path / "waltz_python-0.1.0-py3-none-any.whl"
    wheel.write_bytes(b"")
    if direct_url is not None:
        direct_url["url"] = direct_url["url"].replace("WHEEL", str(wheel))
    monkeypatch.setattr(importlib.metadata, "distributions", lambda name: [_Installed(None), _Installed(direct_url)])
    monkeypatch.setattr(entry, "_checkout", lambda: None)  # as in site-packages
    generic = ("pip install '/path/to/waltz-checkout[cli]' (a checkout of Waltz for Python: the package is on no "
               "index), or the wheel its scripts/dist builds: "
               "pip install 'dist/waltz_python-0.1.0-py3-none-any.whl[cli]'")
    assert entry.install_command("cli") == wanted.replace("WHEEL", str(wheel)).replace("GENERIC", generic)
    assert "waltz-python[" not in entry.install_command("cli")  # the name no index publishes


def test_with_its_packages_the_command_runs(monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr("sys.argv", ["waltz"])
    assert entry.waltz() == 2  # the CLI itself: no command given prints its help and exits 2
    assert capsys.readouterr().out.startswith("usage: waltz")
