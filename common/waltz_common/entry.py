"""The console commands' entry points: each checks that the packages of its extra are installed, and says which
extra to install when they are not, before importing the command (whose imports would fail with a traceback).
`COMMAND --version` answers here, for every command, with or without its extra.

`pip install waltz-python` is the client alone; the commands come with extras (pyproject.toml):
waltz-server, waltz-storage and waltz-dev-certs with `server`, waltz with `cli`, waltz-ingest with `spark`.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Callable

SERVICE_MODULES = ("kazoo", "grpc_health", "grpc_reflection", "uvloop", "cryptography")
"""Import names of the `server` extra's packages."""
CLI_MODULES = (*SERVICE_MODULES, "tqdm")
"""Import names of the `cli` extra's packages (`waltz dev` and the storage tools run service code)."""
SPARK_MODULES = ("pyspark", "pyarrow", "pandas", "kazoo")


def missing_modules(modules: tuple[str, ...]) -> list[str]:
    """The modules of the list that cannot be imported here."""
    return [name for name in modules if importlib.util.find_spec(name) is None]


def _run(command: str, extra: str, modules: tuple[str, ...], target: str) -> int:
    if sys.argv[1:] == ["--version"]:  # answered before the extra's check: an install missing it still says what it is
        from waltz_common.build_info import version_line

        print(version_line(command))
        return 0
    missing = missing_modules(modules)
    if missing:
        print(f"{command}: needs {', '.join(missing)}, which the plain install (the client alone) leaves out: "
              f"pip install 'waltz-python[{extra}]'", file=sys.stderr)
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
