"""`waltz-server CONFIG`: run a server (membership, owned partitions over the replicated store, gRPC)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import sys

from kazoo.client import KazooClient

from waltz.v1 import metadata_pb2, server_pb2
from waltz_common import build_info, event_loop, listen, service_logging, tls
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
from waltz_common.gctune import tune_for_service
from waltz_common.health import SERVING, Verdict, keep_health, start_health_port
from waltz_common.port_guard import CallLimits, LimitSettings
from waltz_common.zk import MetadataError, ZkPaths
from waltz_common.zk_security import ZkSecurity
from waltz_server.cache_budget import CacheBudget
from waltz_server.cluster import ClusterMembership
from waltz_server.config import PartitionSettings, advertised, all_keys, check, liveness_settings
from waltz_server.discovery import ClusterInfo, ClusterView
from waltz_server.health import PartitionHealth, identity_name, server_verdicts
from waltz_server.identity import ClientIdentities, ZkBindingStore
from waltz_server.metrics import ServerMetrics
from waltz_server.ownership import PartitionManager
from waltz_server.peers import PeerWatch
from waltz_server.service import WaltzServerService, partition_status, start_grpc_server
from waltz_server.store.api import StorePartition
from waltz_server.store.connections import StorageConnections
from waltz_server.store.settings import StoreSettings
from waltz_server.store.store_partition import ReplicatedStorePartition

log = logging.getLogger("waltz_server")


async def serve(config: Config) -> int:
    """Run until SIGTERM or SIGINT; returns the exit status."""
    paths = ZkPaths(config["cluster.root"])
    zk = await asyncio.to_thread(
        zkmeta.connect,
        config["zookeeper.connectString"],
        zookeeper_connect_timeout_s(config),
        zookeeper_session_timeout_s(config),
        ZkSecurity.from_config(config),
    )
    try:
        cluster = zkmeta.require(zk, paths.cluster, metadata_pb2.ClusterParams)[0]
        params = zkmeta.store_params(zk, paths)
        if cluster.num_partitions != params.num_partitions:
            raise MetadataError(
                f"{paths.root}: ClusterParams has {cluster.num_partitions} partitions, "
                f"StoreParams {params.num_partitions}: the cluster metadata is inconsistent"
            )
        return await _serve(config, zk, paths, params, cluster.name)
    finally:
        await asyncio.to_thread(zk.stop)
        zk.close()


async def _serve(
    config: Config, zk: KazooClient, paths: ZkPaths, params: metadata_pb2.StoreParams, cluster_name: str
) -> int:
    settings = PartitionSettings.from_config(config)
    store_settings = StoreSettings.from_config(config)
    metrics = ServerMetrics()
    metrics.watch_zookeeper(lambda: str(zk.state))
    calls = CallLimits(LimitSettings.from_config(config, "server"))
    metrics.watch_client_port(calls)
    connections = StorageConnections(params.cluster_key, params.num_partitions, store_settings)

    def store_for(partition_id: int) -> StorePartition:
        return ReplicatedStorePartition(
            partition_id, zk=zk, paths=paths, connections=connections, settings=store_settings
        )

    budget = CacheBudget(config["server.cacheBudgetBytes"])
    metrics.watch_cache_budget(budget)
    manager = PartitionManager(params.num_partitions, store_for, settings, metrics, budget=budget)
    membership: ClusterMembership | None = None
    service = WaltzServerService(
        manager,
        lambda: membership.server_id if membership is not None else -1,
        settings,
        config["server.streamQueueSize"],
        connections.check_connectivity,
        ClientIdentities(ZkBindingStore(zk, paths)),
    )
    host = config["server.host"]
    max_message = max(16 * 1024 * 1024, 2 * settings.max_transaction_bytes + 65536)
    limits = server_pb2.Limits(
        max_message_bytes=max_message,
        max_transaction_bytes=settings.max_transaction_bytes,
        max_batch_appends=settings.append_queue_size,
        max_locks_per_append=settings.max_locks_per_append,
    )
    view = ClusterView(zk, paths, ClusterInfo(cluster_name, params.num_partitions, limits))
    await view.start()  # a watch only: stopped with the ZooKeeper session if what follows fails
    service.serve_discovery(view)
    server, port, health = await start_grpc_server(
        service, host, config["server.port"], max_message, tls.process_files(), calls
    )

    joined = {"cluster": False}  # registered in ZooKeeper once; read by the health verdicts
    nudge = asyncio.Event()

    async def on_connected(connected: bool) -> None:
        nudge.set()  # the partitions' health may change as ZooKeeper comes and goes

    def verdicts() -> dict[str, Verdict]:
        owned = [partition_status(p) for p in manager.all()]
        return server_verdicts(
            joined["cluster"], [PartitionHealth(p.partition_id, p.healthy, p.detail) for p in owned],
            membership.server_id if membership is not None else -1,
        )

    async def on_identity(server_id: int) -> None:
        await health.set(identity_name(server_id), SERVING)  # before peers can probe it (keep_health keeps it)

    health_task = asyncio.create_task(keep_health(health, verdicts, nudge))
    health_server = None
    metrics_http = None
    try:
        if config["server.health.port"]:
            health_server, health_port = await start_health_port(health, host, config["server.health.port"])
            log.info("plaintext health port %s:%d", host, health_port)
        if config["server.metrics.port"]:
            metrics_http, _ = listen.start_metrics_http(config["server.metrics.port"], host, metrics.registry)
        advertised_host, advertised_port = advertised(config, port)
        detector = liveness_settings(config)
        peers = PeerWatch(detector, tls.process_files()) if detector.enabled else None
        membership = ClusterMembership(
            zk, paths, advertised_host, advertised_port, params.num_partitions, manager, on_connected,
            on_identity, peers=peers
        )
        server_id = await membership.start()
        joined["cluster"] = True
        await on_connected(True)
        print(f"waltz-server ready {host}:{port} id={server_id}", file=sys.stderr, flush=True)
        await _until_signalled()
        log.info("server %d: stopping", server_id)
        await _cancelled(health_task)
        await health.enter_graceful_shutdown()
        await membership.stop()
        # close the partitions while the streams are still up: each feed ends with a NOT_READY for its
        # mount, so that clients mount again at the next owner at once rather than when the stream ends
        await manager.close_all()
        service.end_streams()  # the client streams end once they have written those NOT_READYs
        await server.stop(config["server.shutdownGraceSeconds"])
        return 0
    finally:
        await _cancelled(health_task)
        if health_server is not None:
            await health_server.stop(0)
        await server.stop(0)
        view.stop()
        await manager.close_all()
        await connections.close()
        if metrics_http is not None:
            metrics_http.shutdown()


async def _cancelled(task: asyncio.Task[None]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


async def _until_signalled() -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="waltz-server",
        description="Run a Waltz server.",
        epilog="configuration keys (YAML, dotted or nested):\n" + describe(all_keys()),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("config", help="YAML configuration file")
    service_logging.add_arguments(parser)
    build_info.add_version_option(parser)
    args = parser.parse_args(argv)
    try:
        service_logging.configure(args)
    except OSError as exc:
        print(f"waltz-server: cannot open the log file: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    try:
        config = load(args.config, all_keys())
        PartitionSettings.from_config(config)
        CacheBudget(config["server.cacheBudgetBytes"])
        LimitSettings.from_config(config, "server")
        StoreSettings.from_config(config)
        check(config)
        liveness_settings(config)
        ZkSecurity.from_config(config)  # its files and formats are checked before anything starts
        tls.use_for_process(tls.TlsFiles.from_config(config))  # this server's certificate, to storage nodes too
        event_loop.loop_factory()
    except (ConfigError, ValueError) as exc:
        print(f"waltz-server: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    tune_for_service()
    try:
        return event_loop.run(serve(config))
    except MetadataError as exc:
        print(f"waltz-server: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"waltz-server: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        with contextlib.suppress(Exception):
            print("waltz-server: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
