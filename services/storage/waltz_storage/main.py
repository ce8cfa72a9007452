"""`waltz-storage CONFIG`: run a storage node."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="waltz-storage", description="Run a Waltz storage node.")
    parser.add_argument("config", help="YAML configuration file")
    parser.parse_args(argv)
    print("waltz-storage: the storage node is not built yet (issue: storage node)", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
