"""`waltz`: the admin command-line tool (cluster, storage, server, client and disk commands)."""

from __future__ import annotations

import argparse
import sys


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="waltz", description="Administer a Waltz cluster.")
    parser.add_subparsers(dest="group", metavar="{cluster,storage,server,client,disk}")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.group is None:
        parser.print_help()
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
