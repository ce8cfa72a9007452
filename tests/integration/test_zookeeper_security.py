"""ZooKeeper authentication and ACLs on the cluster's znodes: only the listed identities change them (issue 17)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from kazoo.exceptions import NoAuthError
from kazoo.security import Permissions, make_digest_acl_credential

from tests.unit.cli.helpers import waltz
from waltz.v1 import metadata_pb2
from waltz_client import WaltzError, grpc_driver
from waltz_common import devcerts
from waltz_common import zk as zkmeta
from waltz_common.testing.local_cluster import free_port
from waltz_common.testing.zookeeper import ZooKeeperProcess
from waltz_common.topology import take_client_id
from waltz_common.zk_security import WORLD, ZkSecurity

ACL = "; ".join(f"digest:{make_digest_acl_credential(user, user + '-secret')}" for user in ("operator", "server"))


def _connect(zookeeper, user: str | None) -> object:
    auth = f"digest:{user}:{user}-secret" if user else None
    return zkmeta.connect(zookeeper.connect_string, security=ZkSecurity.of(auth=auth, acl=ACL if user else None))


def _operator_config(zookeeper, zk, cluster_root: str, tmp_path: Path) -> Path:
    """The CLI file of an operator who creates the cluster with ACL."""
    # the parent that other tests share exists, open, before the cluster's own znodes get the ACL (created by
    # `cluster create`, it would take the cluster's ACL, and tests run after this one could not use it)
    zk.ensure_path(cluster_root.rsplit("/", 1)[0])
    config = tmp_path / "cli.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "zookeeper.connectString": zookeeper.connect_string,
                "cluster.root": cluster_root,
                "zookeeper.auth": "digest:operator:operator-secret",
                "zookeeper.acl": ACL,
            }
        )
    )
    return config


def test_only_the_listed_identities_change_the_cluster_znodes(zookeeper, zk, cluster_root, capsys, tmp_path):
    config = _operator_config(zookeeper, zk, cluster_root, tmp_path)
    created = waltz(capsys, "-c", str(config), "cluster", "create", "-n", "secure", "-p", "2")
    assert created.code == 0, created.err
    assert "warning" not in created.err
    paths = zkmeta.ZkPaths(cluster_root)
    partition = paths.partition_metadata(0)
    anonymous, server, operator = (_connect(zookeeper, u) for u in (None, "server", "operator"))
    try:
        assert zkmeta.store_params(anonymous, paths).num_partitions == 2  # anyone reads
        with pytest.raises(NoAuthError):
            anonymous.set(partition, b"")
        with pytest.raises(NoAuthError):
            anonymous.delete(paths.root, recursive=True)
        zkmeta.write(server, partition, metadata_pb2.PartitionMetadata(generation=1, session_id=3))
        assert zkmeta.require(operator, partition, metadata_pb2.PartitionMetadata)[0].session_id == 3
        assert take_client_id(server, paths) == 1  # a server hands out client ids (GetClientId)
        assert waltz(capsys, "-c", str(config), "storage", "add-node", "-s", "127.0.0.1:7000", "-a", "7001").code == 0
        refused = waltz(
            capsys,
            "--zookeeper",
            zookeeper.connect_string,
            "--root",
            cluster_root,
            "storage",
            "add-node",
            "-s",
            "127.0.0.1:7002",
            "-a",
            "7003",
        )
        assert refused.code == 1 and "NoAuth" in refused.err, refused.err
    finally:
        for client in (anonymous, server, operator):
            client.stop()
            client.close()


def _world_may_write(zk, path: str) -> list[str]:
    """The znodes at and under path whose ACL lets anyone do more than read."""
    acl, _ = zk.get_acls(path)
    found = [path] if any(a.id == WORLD and a.perms & ~Permissions.READ for a in acl) else []
    for child in zk.get_children(path):
        found += _world_may_write(zk, f"{path}/{child}")
    return found


def test_every_znode_is_created_with_the_acl_and_nothing_later_is_open(zookeeper, zk, cluster_root, capsys, tmp_path):
    # issue 25: <root>/ids/client was created open to the world by the first process that took an id, even on a
    # cluster created with zookeeper.acl: an anonymous write of 2^31-1 stopped every new client, a lower value
    # handed out duplicate ids
    config = _operator_config(zookeeper, zk, cluster_root, tmp_path)
    assert waltz(capsys, "-c", str(config), "cluster", "create", "-n", "secure", "-p", "2").code == 0
    paths = zkmeta.ZkPaths(cluster_root)
    for znode in paths.every_znode(2):
        assert zk.exists(znode) is not None, znode
    anonymous = _connect(zookeeper, None)
    # a server that authenticates but sets no zookeeper.acl of its own: what it creates takes its parent's ACL
    server = zkmeta.connect(zookeeper.connect_string, security=ZkSecurity.of(auth="digest:server:server-secret"))
    try:
        with pytest.raises(NoAuthError):
            anonymous.set(paths.client_ids, b"2147483647")
        with pytest.raises(NoAuthError):
            take_client_id(anonymous, paths)
        with pytest.raises(WaltzError, match=r"set client\.servers to take client ids from the servers"):
            grpc_driver._client_id(anonymous, paths)  # a client configured with ZooKeeper is told what to do
        with pytest.raises(NoAuthError):
            anonymous.create(paths.client_binding(1), b"")
        with pytest.raises(NoAuthError):
            anonymous.set(paths.server_ids, b"-5")
        assert take_client_id(server, paths) == 1
        assert zkmeta.increment(server, paths.server_ids) == 1
        zkmeta.create(server, paths.server(1), metadata_pb2.ServerDescriptor(server_id=1), ephemeral=True)
        zkmeta.create(server, paths.client_binding(1), metadata_pb2.ClientIdentity(subject="CN=a"))
        assert _world_may_write(zk, paths.root) == []
        with pytest.raises(NoAuthError):
            anonymous.set(paths.client_binding(1), b"")
        with pytest.raises(NoAuthError):
            anonymous.set(paths.server(1), b"")
    finally:
        for client in (anonymous, server):
            client.stop()
            client.close()


def test_a_cluster_created_without_an_acl_says_so(zookeeper, cluster_root, capsys):
    created = waltz(
        capsys, "--zookeeper", zookeeper.connect_string, "--root", cluster_root, "cluster", "create", "-n", "open",
        "-p", "1",
    )
    assert created.code == 0, created.err
    assert "waltz: warning: the cluster was created without zookeeper.acl" in created.err


@pytest.fixture
def secure_zookeeper(tmp_path):
    """A ZooKeeper whose secure client port needs a client certificate of the development CA (PEM stores)."""
    certs = devcerts.write(tmp_path / "certs")
    (tmp_path / "zookeeper.pem").write_bytes(certs["storage-key"].read_bytes() + certs["storage"].read_bytes())
    secure_port = free_port()
    directory = tmp_path / "zookeeper"
    directory.mkdir()
    (directory / "zoo.extra.cfg").write_text(
        f"secureClientPort={secure_port}\nsecureClientPortAddress=127.0.0.1\n"
        "serverCnxnFactory=org.apache.zookeeper.server.NettyServerCnxnFactory\n"
        f"ssl.keyStore.location={tmp_path / 'zookeeper.pem'}\nssl.keyStore.type=PEM\n"
        f"ssl.trustStore.location={certs['ca']}\nssl.trustStore.type=PEM\nssl.clientAuth=need\n"
    )
    process = ZooKeeperProcess(directory)
    process.start()
    try:
        yield f"127.0.0.1:{secure_port}", certs
    finally:
        process.stop()


def test_tls_to_zookeeper_with_x509_acls(secure_zookeeper, capsys, tmp_path):
    address, certs = secure_zookeeper
    config = tmp_path / "cli.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "zookeeper.connectString": address,
                "cluster.root": "/secure",
                "zookeeper.tls.certFile": str(certs["operator"]),
                "zookeeper.tls.keyFile": str(certs["operator-key"]),
                "zookeeper.tls.caFile": str(certs["ca"]),
                "zookeeper.acl": "x509:CN=waltz operator,O=waltz",
            }
        )
    )
    created = waltz(capsys, "-c", str(config), "cluster", "create", "-n", "tls", "-p", "1", "--timeout", "20")
    assert created.code == 0, created.err
    plain = waltz(capsys, "--zookeeper", address, "--root", "/secure", "--timeout", "3", "cluster", "list")
    assert plain.code == 1 and "cannot reach ZooKeeper" in plain.err
    app = ZkSecurity.of(str(certs["application"]), str(certs["application-key"]), str(certs["ca"]))
    other = zkmeta.connect(address, timeout_s=20, security=app)
    try:
        assert zkmeta.store_params(other, zkmeta.ZkPaths("/secure")).num_partitions == 1  # anyone reads
        with pytest.raises(NoAuthError):  # only the operator's certificate may change the znodes
            other.set(zkmeta.ZkPaths("/secure").partition_metadata(0), b"")
    finally:
        other.stop()
        other.close()
