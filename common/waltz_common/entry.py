"""The console commands' entry points: each checks that the packages of its extra are installed, and says which
extra to install when they are not, before importing the command (whose imports would fail with a traceback).
`COMMAND --version` answers here, for every command, with or without its extra.

The plain install is the client alone; the commands come with extras (pyproject.toml): waltz-server,
waltz-storage and waltz-dev-certs with `server`, waltz with `cli`, waltz-ingest with `spark`. The package is on no
index, so install_command names where this install came from (its checkout, or its wheel), as pip recorded it.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

DISTRIBUTION = "waltz-python"

SERVICE_MODULES = ("kazoo", "grpc_health", "grpc_reflection", "uvloop", "cryptography")
"""Import names of the `server` extra's packages."""
CLI_MODULES = (*SERVICE_MODULES, "tqdm")
"""Import names of the `cli` extra's packages (`waltz dev` and the storage tools run service code)."""
SPARK_MODULES = ("pyspark", "pyarrow", "pandas", "numpy", "kazoo")


def missing_modules(modules: tuple[str, ...]) -> list[str]:
    """The modules of the list that cannot be imported here."""
    return [name for name in modules if importlib.util.find_spec(name) is None]


def install_command(extra: str) -> str:
    """The pip command that adds an extra to this install: from the checkout it was installed from (editable or
    not), or the wheel file it was installed from while that file is still there, as pip recorded it (PEP 610's
    direct_url.json); else from the checkout these modules are in; else named generically (no index has it)."""
    origin: dict[str, Any] = {}
    version = "0.1.0"
    for distribution in importlib.metadata.distributions(name=DISTRIBUTION):  # a checkout's egg-info may come first
        version = distribution.version or version
        recorded = distribution.read_text("direct_url.json")
        if recorded:
            origin = json.loads(recorded)
            break
    url = urlparse(str(origin.get("url", "")))
    path = Path(unquote(url.path)) if url.scheme == "file" else None
    if path is not None and "dir_info" in origin and (path / "pyproject.toml").is_file():
        editable = "-e " if origin["dir_info"].get("editable") else ""
        return f"pip install {editable}'{path}[{extra}]'"
    if path is not None and "archive_info" in origin and path.is_file():
        return f"pip install '{path}[{extra}]'"
    checkout = _checkout()
    if checkout is not None:
        return f"pip install -e '{checkout}[{extra}]'"
    return (f"pip install '/path/to/waltz-checkout[{extra}]' (a checkout of Waltz for Python: the package is on no "
            f"index), or the wheel its scripts/dist builds: "
            f"pip install 'dist/waltz_python-{version}-py3-none-any.whl[{extra}]'")


def _checkout() -> Path | None:
    """The checkout these modules run from (common/waltz_common/ in it), if they do."""
    root = Path(__file__).resolve().parents[2]
    project = root / "pyproject.toml"
    return root if project.is_file() and f'name = "{DISTRIBUTION}"' in project.read_text() else None


def _run(command: str, extra: str, modules: tuple[str, ...], target: str) -> int:
    if sys.argv[1:] == ["--version"]:  # answered before the extra's check: an install missing it still says what it is
        from waltz_common.build_info import version_line

        print(version_line(command))
        return 0
    missing = missing_modules(modules)
    if missing:
        print(f"{command}: needs {', '.join(missing)}, which the plain install (the client alone) leaves out: "
              f"{install_command(extra)}", file=sys.stderr)
        return 1
    module, _, name = target.partition(":")
    main: Callable[[], int] = getattr(importlib.import_module(module), name)
    return main()


def waltz() -> int:
    return _run("waltz", "cli", CLI_MODULES, "waltz_cli.main:main")


def waltz_server() -> int:
    return _run("waltz-server", "server", SERVICE_MODULES, "waltz_server.main:main")


def waltz_storage() -> int:
    return _run("waltz-storage", "server", SERVICE_MODULES, "waltz_storage.main:main")


def waltz_ingest() -> int:
    return _run("waltz-ingest", "spark", SPARK_MODULES, "waltz_spark.ingest:main")


def waltz_dev_certs() -> int:
    return _run("waltz-dev-certs", "server", ("cryptography",), "waltz_common.devcerts:main")
