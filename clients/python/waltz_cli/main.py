"""`waltz`: the admin command-line tool (cluster, storage, server, client, disk, perf and dev commands)."""

from __future__ import annotations

import argparse
import logging
import sys
import traceback
from typing import NoReturn

from waltz_cli import client, cluster, dev, disk, perf, server, storage
from waltz_cli.context import Context
from waltz_cli.errors import EXIT_FAILED, EXIT_USAGE, CliError, one_line
from waltz_cli.output import Result, reader_gone
from waltz_common import build_info
from waltz_common.config import EXIT_CONFIG, ConfigError

EPILOG = """\
Where the cluster is: -c CLI.yaml (keys zookeeper.connectString, zookeeper.sessionTimeoutSeconds,
zookeeper.connectTimeoutSeconds, cluster.root; with mutual TLS tls.certFile, tls.keyFile, tls.caFile:
an operator certificate, see docs/security.md) or --zookeeper HOST:PORT --root /path. The client,
server and perf commands also work from server addresses alone: --server-addresses HOST:PORT,...
(client.servers in the CLI file); cluster verify takes them as the servers that must be up.
Each key can also come from a WALTZ_* variable, as for the client: WALTZ_ZOOKEEPER_CONNECT_STRING,
WALTZ_CLUSTER_ROOT, WALTZ_CLIENT_SERVERS, WALTZ_TLS_CERT_FILE, ... (a flag wins over -c, -c over a variable).
Partition ranges look like 0-6,8. Add --json for machine-readable output. Exit codes: 0 ok, 1 failed, 2 bad usage.
"""


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors are one line on stderr and exit code 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


SERVER_ADDRESSES_HELP = "Waltz servers to ask instead of ZooKeeper (client.servers in the CLI file)"


def _global_options(parser: argparse.ArgumentParser, defaults: bool, servers: bool = True) -> None:
    """The options every subcommand accepts; the subcommand copies do not override the top level's. servers: with
    --server-addresses (only the commands that use it list it in their --help)."""

    def d(value: object) -> object:
        return value if defaults else argparse.SUPPRESS

    group: argparse._ActionsContainer = parser if defaults else parser.add_argument_group("global options")

    group.add_argument("-c", "--config", default=d(None), metavar="CLI.yaml", help="CLI configuration file")
    group.add_argument("--zookeeper", default=d(None), metavar="HOST:PORT", help="ZooKeeper connect string")
    group.add_argument("--root", default=d(None), metavar="ZNODE", help="the cluster root, e.g. /waltz/my_cluster")
    if servers:
        group.add_argument("--server-addresses", default=d(None), metavar="HOST:PORT,...",
                           help=SERVER_ADDRESSES_HELP + ("" if not defaults else "; client, server and perf commands"))
    group.add_argument("--json", action="store_true", default=d(False), help="machine-readable output")
    group.add_argument("--timeout", type=float, default=d(10.0), metavar="S", help="seconds per call (default 10)")
    group.add_argument(
        "--progress", action=argparse.BooleanOptionalAction, default=d(None), help="progress bars (default: on a tty)"
    )
    group.add_argument("--debug", action="store_true", default=d(False), help="show tracebacks and logs")
    group.add_argument("--tls-cert", default=d(None), metavar="PEM", help="operator certificate (tls.certFile)")
    group.add_argument("--tls-key", default=d(None), metavar="PEM", help="its private key (tls.keyFile)")
    group.add_argument("--tls-ca", default=d(None), metavar="PEM", help="the cluster's CA (tls.caFile)")


def build_parser() -> argparse.ArgumentParser:
    """The whole command tree."""
    parser = Parser(prog="waltz", description="Administer a Waltz cluster.", epilog=EPILOG)
    build_info.add_version_option(parser)
    _global_options(parser, defaults=True)
    common = Parser(add_help=False)
    _global_options(common, defaults=False, servers=False)
    with_servers = Parser(add_help=False)  # the commands that work from --server-addresses as well
    _global_options(with_servers, defaults=False)
    groups = parser.add_subparsers(
        dest="group", metavar="{cluster,storage,server,client,disk,perf,dev}", parser_class=Parser
    )
    for module in (cluster, storage, disk, dev):
        module.register(groups, common)
    for module in (server, client, perf):
        module.register(groups, with_servers)
    return parser


def run(argv: list[str] | None = None) -> tuple[Result | None, bool]:
    """Parse and run one command, returning its result and whether --json was asked; errors propagate."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.group is None:
        parser.print_help()
        return None, False
    ctx = Context.from_args(args)
    try:
        result: Result = args.func(ctx, args)
    finally:
        ctx.close()
    return result, ctx.as_json


def main(argv: list[str] | None = None) -> int:
    """Entry point: output on stdout, one line on stderr for any failure (a traceback with --debug)."""
    raw = sys.argv[1:] if argv is None else argv
    debug = "--debug" in raw
    logging.basicConfig(level=logging.DEBUG if debug else logging.CRITICAL + 1, stream=sys.stderr)
    try:
        result, as_json = run(raw)
        if result is not None and (result.data is not None or result.text):
            print(result.render(as_json), flush=True)
    except BrokenPipeError:  # the reader went away (`waltz client tail | head`): what it wanted was printed
        reader_gone()
        return 0
    except KeyboardInterrupt:
        print("waltz: interrupted", file=sys.stderr)
        return 130
    except (CliError, ConfigError) as exc:
        if debug:
            traceback.print_exc()
        print(f"waltz: error: {one_line(exc)}", file=sys.stderr)
        # a bad -c file (or one a command was given) exits with the services' configuration status
        return exc.exit_code if isinstance(exc, CliError) else EXIT_CONFIG
    except Exception as exc:
        if debug:
            traceback.print_exc()
        print(f"waltz: error: {one_line(exc)}", file=sys.stderr)
        return EXIT_FAILED
    if result is None:
        return EXIT_USAGE
    return result.exit_code


if __name__ == "__main__":
    sys.exit(main())
