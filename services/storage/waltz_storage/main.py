"""`waltz-storage CONFIG`: run a storage node until SIGTERM or SIGINT."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import sys
import uuid
from functools import partial

from kazoo.client import KazooClient
from kazoo.exceptions import KazooException

from waltz_common import build_info, cluster_admin, event_loop, listen, service_logging, tls
from waltz_common import zk as zkmeta
from waltz_common.config import (
    EXIT_CONFIG,
    Config,
    ConfigError,
    describe,
    load,
    zookeeper_connect_timeout_s,
    zookeeper_session_timeout_s,
)
from waltz_common.port_guard import LimitMetrics, LimitSettings
from waltz_common.zk import MetadataError, ZkPaths
from waltz_common.zk_security import ZkSecurity
from waltz_storage import server, zk_view
from waltz_storage.config import STORAGE_KEYS, check
from waltz_storage.dispatch import Limits
from waltz_storage.errors import StorageError
from waltz_storage.node import StorageNode
from waltz_storage.scrubber import Scrubber

log = logging.getLogger("waltz_storage")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="waltz-storage",
        description="Run a Waltz storage node: the storage protocol, the admin protocol and /metrics.",
        epilog="configuration keys (YAML, dotted or nested), with defaults:\n" + describe(STORAGE_KEYS),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("config", help="the node's YAML configuration file (see config/storage.example.yaml)")
    service_logging.add_arguments(parser)
    build_info.add_version_option(parser)
    return parser


def connect_zookeeper(config: Config) -> KazooClient:
    return zkmeta.connect(
        config["zookeeper.connectString"],
        timeout_s=zookeeper_connect_timeout_s(config),
        session_timeout_s=zookeeper_session_timeout_s(config),
        security=ZkSecurity.from_config(config),
    )


def identity(config: Config) -> str:
    """The node's connect string in the cluster (waltz storage add-node HOST:PORT:ADMIN_PORT)."""
    return f"{config['storage.host']}:{config['storage.port']}"


def read_store_params(client: KazooClient, config: Config) -> tuple[uuid.UUID, int]:
    """The cluster key and partition count from <cluster.root>/store; MetadataError if there is no cluster."""
    paths = ZkPaths(config["cluster.root"])
    params = zkmeta.store_params(client, paths)
    try:
        key = uuid.UUID(params.cluster_key)
    except ValueError:
        raise MetadataError(f"znode {paths.store} holds a cluster key that is not a UUID") from None
    try:
        known = cluster_admin.storage_nodes(client, paths)
    except MetadataError:
        known = {}
    if identity(config) not in known:
        log.warning(
            "this node (%s) is not registered in the cluster at %s (waltz storage add-node)", identity(config),
            paths.root
        )
    return key, params.num_partitions


async def serve(
    config: Config, node: StorageNode, files: tls.TlsFiles | None = None, zookeeper: KazooClient | None = None
) -> int:
    """Serve until a signal, then shut down gracefully; returns the exit status. With zookeeper, readiness follows
    what it assigns the node (waltz_storage.zk_view)."""
    host = config["storage.host"]
    try:
        servers = await server.start(
            node,
            host,
            config["storage.port"],
            config["storage.admin.port"],
            files,
            config["storage.health.port"] or None,
            LimitSettings.from_config(config, "storage"),
            config["storage.sessionPort"] or None,
            config["storage.sessionAdvertisedPort"],
        )
    except OSError as e:
        await asyncio.to_thread(node.close)
        print(f"waltz-storage: {e}", file=sys.stderr)
        return 1
    metrics_port = config["storage.metrics.port"]
    metrics_http = None
    try:
        if servers.limits is not None:
            node.metrics.registry.register(LimitMetrics("waltz_storage", servers.limits, label="port"))
        if metrics_port:
            metrics_http = listen.start_metrics_http(metrics_port, host, node.metrics.registry)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        print(
            f"waltz-storage ready {host}:{servers.storage_port} admin={servers.admin_port} "
            f"session={servers.session.port if servers.session is not None else 'off'} metrics={metrics_port or 'off'}",
            file=sys.stderr,
            flush=True,
        )
        scrubbing = viewing = None
        if zookeeper is not None:
            paths, me = ZkPaths(config["cluster.root"]), identity(config)
            viewing = loop.create_task(
                zk_view.keep_view(partial(zk_view.read_view, zookeeper, paths, me), partial(setattr, node, "zk_view")),
                name="zookeeper view",
            )
        if config["storage.scrub.bytesPerSecond"]:
            scrubber = Scrubber(node, config["storage.scrub.bytesPerSecond"], config["storage.scrub.intervalSeconds"])
            scrubbing = loop.create_task(scrubber.run(), name="scrubbing")
        try:
            await stop.wait()
        finally:
            for task in (scrubbing, viewing):
                if task is not None:
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
        log.info("shutting down: finishing in-flight requests (grace %gs)", config["storage.shutdownGraceSeconds"])
    finally:
        await servers.stop(config["storage.shutdownGraceSeconds"])
        if metrics_http is not None:
            metrics_http[0].shutdown()
    log.info("stopped")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        service_logging.configure(args)
    except OSError as e:
        print(f"waltz-storage: cannot open the log file: {e}", file=sys.stderr)
        return EXIT_CONFIG
    try:
        config = load(args.config, STORAGE_KEYS)
        check(config)
        LimitSettings.from_config(config, "storage")
        files = tls.TlsFiles.from_config(config)
        ZkSecurity.from_config(config)  # its files and formats are checked before anything starts
        event_loop.loop_factory()
    except ConfigError as e:
        print(f"waltz-storage: {e}", file=sys.stderr)
        return EXIT_CONFIG
    zookeeper = None
    try:
        zookeeper = connect_zookeeper(config)
        cluster_key, num_partitions = read_store_params(zookeeper, config)
        node = StorageNode.open(
            config["storage.directory"],
            cluster_key,
            num_partitions,
            limits=Limits(config["storage.maxRecordBytes"], config["storage.maxBatchBytes"]),
            segment_size_threshold=config["storage.segment.size.threshold"],
        )
        # before the first probe: a wiped node must not answer ready for the seconds until the view's first read
        node.zk_view = zk_view.read_view(zookeeper, ZkPaths(config["cluster.root"]), identity(config))
    except (ConfigError, MetadataError, StorageError, OSError, KazooException) as e:
        print(f"waltz-storage: {e}", file=sys.stderr)
        close_zookeeper(zookeeper)
        return 1
    log.info(  # never the cluster key: without TLS it is the storage port's credential
        "storage directory %s: %d partitions, assigned here: %s",
        config["storage.directory"],
        num_partitions,
        node.manager.assigned_partitions() or "none",
    )
    try:
        return event_loop.run(serve(config, node, files, zookeeper))
    except OSError as e:  # the metrics port (the gRPC ports are answered in serve)
        print(f"waltz-storage: {e}", file=sys.stderr)
        return 1
    finally:
        close_zookeeper(zookeeper)


def close_zookeeper(client: KazooClient | None) -> None:
    if client is not None:
        client.stop()
        client.close()


if __name__ == "__main__":
    sys.exit(main())
