"""`waltz dev`: a local cluster on loopback that stays up until Ctrl-C, to try an application against.

It starts ZooKeeper, the storage nodes and the servers (a LocalCluster), prints the client
configuration (client.servers: the servers' addresses; an application needs no ZooKeeper) and the
admin commands' configuration file (ZooKeeper and the servers), and serves until SIGINT or SIGTERM
(or SIGHUP: the terminal closed); then it stops the servers, the storage nodes and ZooKeeper in that
order, by pid, and exits 0. The processes run in sessions of their own, so a terminal's Ctrl-C
reaches only `waltz dev`, which stops them in order. With --data DIR the data (ZooKeeper's and the
storage nodes') stays in DIR and the next run on DIR goes on with it; without, it lives in a
temporary directory removed at exit.
"""

from __future__ import annotations

import argparse
import signal
import tempfile
import threading
import time
from pathlib import Path
from types import FrameType

import yaml

from waltz_cli.context import Context
from waltz_cli.errors import CliError, UsageError
from waltz_cli.output import Result

READY_LINE = "waltz dev: serving until Ctrl-C (SIGINT) or SIGTERM"


def register(groups: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    """Add the dev command."""
    parser = groups.add_parser("dev", help="run a local cluster until Ctrl-C, to develop against",
                               description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                               parents=[common])
    parser.add_argument("--partitions", type=int, help="partitions (default 2; kept data: as it was)")
    parser.add_argument("--storage-nodes", type=int, help="storage nodes, each holding every partition (default 3)")
    parser.add_argument("--servers", type=int, help="servers (default 1; may change between runs on kept data)")
    parser.add_argument("--data", type=Path, metavar="DIR",
                        help="keep the cluster's data in DIR and go on with it on the next run (default: a temp dir)")
    parser.set_defaults(func=dev_cmd)


def dev_cmd(ctx: Context, args: argparse.Namespace) -> Result:
    """Start, print the client configuration, wait for a signal, stop."""
    from waltz_common.testing.dev_cluster import DevCluster, DevClusterError  # starts services: a heavier import

    for option, value in (("--partitions", args.partitions), ("--storage-nodes", args.storage_nodes),
                          ("--servers", args.servers)):
        if value is not None and value < 1:
            raise UsageError(f"{option} must be at least 1")
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    # SIGHUP too: the services run in sessions of their own, so a closed terminal must stop them through us.
    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        with tempfile.TemporaryDirectory(prefix="waltz-dev-") as tmp:
            workdir = args.data.resolve() if args.data else Path(tmp)
            try:
                cluster = DevCluster.open(workdir, partitions=args.partitions, storage_nodes=args.storage_nodes,
                                          servers=args.servers, cluster_root=args.root)
            except DevClusterError as exc:
                raise CliError(str(exc)) from None
            state = cluster.state
            say(f"{'starting the kept cluster' if cluster.resume else 'starting'}: ZooKeeper, "
                f"{state.storage_nodes} storage node(s), {state.servers} server(s), {state.partitions} partition(s) "
                f"in {workdir}{'' if args.data else ' (removed at exit)'} ...")
            started = time.monotonic()
            try:
                cluster.start()
            except DevClusterError as exc:
                raise CliError(str(exc)) from None
            try:
                cluster.save_state()
                config_path = cluster.write_client_config()
                say(f"up in {time.monotonic() - started:.1f} s; the client configuration (also in {config_path}):")
                print("\n" + yaml.safe_dump(cluster.client_config(), sort_keys=False), flush=True)
                print(f"  admin    waltz -c {cluster.write_cli_config()} cluster verify   (the admin commands "
                      "read ZooKeeper too)")
                for node in cluster.storage:
                    print(f"  storage  {node.connect_string}  admin {node.admin_port}  "
                          f"metrics http://127.0.0.1:{node.metrics_port}/metrics  log {node.log_path}")
                for server in cluster.servers:
                    print(f"  server   {server.address}  metrics http://127.0.0.1:{server.metrics_port}/metrics  "
                          f"log {server.log_path}")
                print(READY_LINE, flush=True)
                while not stop.wait(0.5):
                    pass
                say("stopping ...")
            finally:
                cluster.stop()
            say("stopped" + (f"; the data stays in {workdir}" if args.data else ""))
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return Result(None)


def say(line: str) -> None:
    print(f"waltz dev: {line}", flush=True)
