"""The services ask gRPC for its faster I/O path before gRPC is imported, unless the operator chose."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from waltz_common.grpc_env import FAST_IO_EXPERIMENTS

PROBE = "import {package}, grpc, os; print(os.environ.get('GRPC_EXPERIMENTS', ''))"


@pytest.mark.parametrize("package", ["waltz_server.main", "waltz_storage.main"])
@pytest.mark.parametrize("preset", [None, "-event_engine_client"])
def test_services_set_the_experiments_unless_set_already(package: str, preset: str | None) -> None:
    env = {k: v for k, v in os.environ.items() if k != "GRPC_EXPERIMENTS"}
    if preset is not None:
        env["GRPC_EXPERIMENTS"] = preset
    out = subprocess.run(
        [sys.executable, "-c", PROBE.format(package=package)], env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == (preset if preset is not None else FAST_IO_EXPERIMENTS)
