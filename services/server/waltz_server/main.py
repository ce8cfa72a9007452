"""`waltz-server CONFIG`: run a server."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="waltz-server", description="Run a Waltz server.")
    parser.add_argument("config", help="YAML configuration file")
    parser.parse_args(argv)
    print("waltz-server: the server is not built yet (issue: server)", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
