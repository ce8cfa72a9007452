"""`waltz client validate`: producers append under one shared write lock; consumers check data == transaction id."""

from __future__ import annotations

import argparse

from waltz_cli.context import Context
from waltz_cli.errors import CliError
from waltz_cli.output import Result


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    """Add `client validate`."""
    p = sub.add_parser("validate", help="prove the write lock stops stale writers", parents=[common])
    p.add_argument("-n", "--transactions", type=int, default=100, help="transactions per producer (default 100)")
    p.add_argument("--producers", type=int, default=2, help="producer clients (default 2)")
    p.add_argument("--consumers", type=int, default=1, help="consumer clients (default 1)")
    p.add_argument("-p", "--partition", type=int, default=0, help="the partition to use (default 0)")
    p.set_defaults(func=validate_cmd)


def validate_cmd(ctx: Context, args: argparse.Namespace) -> Result:
    """Run the workload."""
    raise CliError("client validate needs the waltz_client library, which has not landed yet")
