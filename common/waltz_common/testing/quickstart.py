"""The quick start: a local cluster on loopback (ZooKeeper, 3 storage nodes, a server) and the bank demo."""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import time
from pathlib import Path

from waltz_common.testing.local_cluster import LocalCluster


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="quickstart", description=__doc__)
    parser.add_argument("--storage-nodes", type=int, default=3, help="storage nodes (replicas of every partition)")
    parser.add_argument("--servers", type=int, default=1, help="servers")
    parser.add_argument("--partitions", type=int, default=2, help="partitions")
    parser.add_argument("--clients", type=int, default=4, help="concurrent bank application instances")
    parser.add_argument("--transactions", type=int, default=400, help="bank operations to submit")
    parser.add_argument("--accounts", type=int, default=6, help="bank accounts")
    parser.add_argument("--workdir", type=Path, help="keep logs, configs and data here (default: a temp dir)")
    parser.add_argument("--tls", action="store_true", help="mutual TLS on every channel (development certificates)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("kazoo").setLevel(logging.ERROR)  # it warns about connections we close on purpose

    from waltz_client.demo.bank import run_demo  # the client library is a heavier import

    with tempfile.TemporaryDirectory(prefix="waltz-quickstart-") as tmp:
        workdir = args.workdir or Path(tmp)
        started = time.monotonic()
        print(f"quickstart: starting ZooKeeper, {args.storage_nodes} storage nodes and {args.servers} server(s) "
              f"with {args.partitions} partitions in {workdir} ...", flush=True)
        cluster = LocalCluster(workdir, storage_nodes=args.storage_nodes, servers=args.servers,
                               partitions=args.partitions, name="quickstart", tls=args.tls)
        with cluster:
            print(f"quickstart: cluster up in {time.monotonic() - started:.1f} s", flush=True)
            print(f"  zookeeper   {cluster.zookeeper}   root {cluster.paths.root}   key {cluster.cluster_key}")
            for node in cluster.storage:
                print(f"  storage     {node.connect_string}   admin {node.admin_port}   "
                      f"metrics http://127.0.0.1:{node.metrics_port}/metrics")
            for server in cluster.servers:
                print(f"  server      {server.address}   metrics http://127.0.0.1:{server.metrics_port}/metrics")
            if cluster.tls_dir is not None:
                print(f"  tls         mutual TLS; certificates in {cluster.tls_dir} (docs/security.md); the CLI "
                      f"needs --tls-cert {cluster.tls_dir}/operator.pem --tls-key {cluster.tls_dir}/operator-key.pem "
                      f"--tls-ca {cluster.tls_dir}/ca.pem")
            print("quickstart: running the bank demo (deposits; withdrawals guarded by locks) ...", flush=True)
            report = run_demo(cluster.client_config(), num_clients=args.clients,
                              num_transactions=args.transactions, num_accounts=args.accounts)
            print("quickstart: stopping everything ...", flush=True)
        print(f"quickstart: {'done' if report.ok else 'FAILED'}; everything stopped "
              f"({time.monotonic() - started:.1f} s in all)")
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
