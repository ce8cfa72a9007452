"""How a service's log is set up: to stderr (journald, container runtimes) or to a file that logrotate may move."""

from __future__ import annotations

import argparse
import logging
import logging.handlers
import sys

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The --log-file and --log-level options every service takes."""
    parser.add_argument(
        "--log-file", metavar="PATH",
        help="append the log to PATH instead of stderr; the file is reopened when it is moved or removed, so "
             "logrotate needs no copytruncate and no signal")
    parser.add_argument("--log-level", choices=LEVELS, default="INFO", help="the least severe level logged (INFO)")


def configure(args: argparse.Namespace) -> None:
    """Send the root logger to the file or stderr that args names; OSError if the file cannot be opened."""
    handler: logging.Handler
    if args.log_file:
        handler = logging.handlers.WatchedFileHandler(args.log_file, encoding="utf-8")
    else:
        handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(FORMAT))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(args.log_level)
    logging.getLogger("kazoo").setLevel(max(logging.WARNING, root.level))
