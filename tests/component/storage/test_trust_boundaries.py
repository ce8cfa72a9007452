"""Issue 25: the storage rules a node enforces whoever asks, over real gRPC, without and with mutual TLS.

Without TLS the cluster key is the only credential (its holder is trusted as a server); with TLS the
server certificate writes online and an operator certificate only offline, on an unwritable partition.
Whoever asks, no truncation cuts committed transactions, reads never raise the session fence, and the
cluster key appears in no message and no log line.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Iterator

import pytest

from tests.component.storage.node_harness import KEY, NodeThread, SessionClient, record, records
from waltz.v1 import storage_pb2
from waltz_common import devcerts
from waltz_storage.admin_client import StorageAdminClient, StorageAdminError

Code = storage_pb2.StorageRpcException.ErrorCode
HUGE = 10**12


@pytest.fixture(
    params=[(False, False), (True, False), (False, True), (True, True)],
    ids=["plaintext", "tls", "plaintext-framed", "tls-framed"],
)
def node(request, tmp_path) -> Iterator[NodeThread]:
    """A node with and without TLS; its Session stream over gRPC, and over the framed session port."""
    secure, framed = request.param
    tls_dir = None
    if secure:
        tls_dir = tmp_path / "tls"
        devcerts.write(tls_dir)
    with NodeThread(tmp_path / "storage", tls_dir=tls_dir, framed=framed) as running:
        with admin(running) as a:
            a.assign(0)
            a.assign(1)
        yield running


def admin(node: NodeThread) -> StorageAdminClient:
    return StorageAdminClient("127.0.0.1", node.servers.admin_port, str(KEY), 3, tls_files=node.tls_files("operator"))


def server(node: NodeThread, session_id: int) -> SessionClient:
    """A caller with the server role (without TLS: anyone with the cluster key)."""
    return node.session_client(session_id, "server")


def operator(node: NodeThread, session_id: int) -> SessionClient:
    return node.session_client(session_id, "operator")


def refused(answer, code: int, match: str = "") -> str:
    kind, msg = answer
    assert kind == "failure", f"expected a failure, got {kind}: {msg}"
    assert msg.exception.code == code, msg.exception
    assert match in msg.exception.message, msg.exception.message
    return str(msg.exception.message)


def ok(answer) -> None:
    kind, msg = answer
    assert kind != "failure", msg.exception.message


async def write_903(c: SessionClient, tell_committed: bool) -> None:
    """Transactions 0..903 in batches of 101, each telling (like a server) the high-water mark before it."""
    ok(await c.ask("set_low_water_mark", low_water_mark=-1))
    for first in range(0, 904, 101):
        fields = {"committed_high_water_mark": first - 1} if tell_committed else {}
        ok(await c.append(0, records(first, min(101, 904 - first)), **fields))


def set_writable(node: NodeThread, writable: bool) -> None:
    with admin(node) as a:
        a.set_writable(0, writable)


def max_id(node: NodeThread, pid: int = 0) -> int:
    return node.node.manager.partition(pid).max_transaction_id


def test_no_truncate_below_the_low_water_mark(node):
    """Finding: SetLowWaterMark 903 then Truncate 100 and -1 were accepted on a live, writable partition."""

    async def scenario():
        async with server(node, 1) as c:
            await c.open()
            await write_903(c, tell_committed=False)
            ok(await c.ask("set_low_water_mark", low_water_mark=903))
            for keep in (100, -1):
                refused(await c.ask("truncate", transaction_id=keep), Code.COMMITTED_DATA, "up to 903 are committed")
            for keep in (100, -1):  # a newer session (which fences session 1 out) may not either
                refused(await c.ask("truncate", transaction_id=keep, session_id=2), Code.COMMITTED_DATA)
            refused(await c.ask("set_low_water_mark", low_water_mark=100, session_id=2), Code.COMMITTED_DATA)

    node.call(scenario())
    assert max_id(node) == 903


def test_no_truncate_below_what_a_session_said_is_committed(node):
    """Finding: truncate to 100 and SetLowWaterMark(session + 1, 100) on 2 of 3 replicas, then a server
    restart, lost 803 committed transactions. The appends told the node that 0..807 are committed (the last
    batch, 808..903, said 807)."""

    async def scenario():
        async with server(node, 1) as c:
            await c.open()
            await write_903(c, tell_committed=True)
            message = refused(await c.ask("truncate", transaction_id=100, session_id=2), Code.COMMITTED_DATA)
            assert "up to 807 are committed" in message
            refused(await c.ask("set_low_water_mark", low_water_mark=100, session_id=2), Code.INVALID_REQUEST)
            # A recovery may still remove the uncommitted tail.
            _kind, msg = await c.ask("truncate", transaction_id=807, session_id=2)
            assert msg.transaction_id == 807
            refused(await c.ask("truncate", transaction_id=806, session_id=2), Code.COMMITTED_DATA)

    node.call(scenario())
    assert max_id(node) == 807
    with admin(node) as a:
        assert {p.partition_id: p.committed_high_water_mark for p in a.list_partitions()}[0] == 807


def test_only_the_server_role_writes_online(node):
    """Findings: an operator's online Truncate was accepted; a record at max+1 could be forged. Under TLS
    an operator certificate reads, and writes only offline on an unwritable partition. Without TLS the
    cluster key is the only credential: its holder is a server (docs/security.md, "Without TLS")."""
    if node.tls_dir is None:
        pytest.skip("without TLS every caller with the cluster key is trusted as a server")

    async def scenario():
        async with server(node, 3) as s, operator(node, 3) as o:
            await s.open()
            await o.open()
            ok(await s.ask("set_low_water_mark", low_water_mark=-1))
            ok(await s.append(0, records(0, 5)))
            refused(await o.append(0, records(5, 1)), Code.PERMISSION_DENIED, "only the server role")
            refused(await o.ask("truncate", transaction_id=2), Code.PERMISSION_DENIED, "role operator")
            refused(await o.ask("set_low_water_mark", low_water_mark=9, session_id=4), Code.PERMISSION_DENIED)
            _kind, msg = await o.ask("max_transaction_id")
            assert msg.transaction_id == 4  # reads are fine
            refused(await o.append(0, records(5, 1), offline=True), Code.PARTITION_UNAVAILABLE, "unwritable")
            await asyncio.to_thread(set_writable, node, False)
            ok(await o.append(0, records(5, 1), offline=True))  # recover-partition's way
            await asyncio.to_thread(set_writable, node, True)
            ok(await s.append(0, records(6, 1)))

    node.call(scenario())
    assert max_id(node) == 6


def test_reads_of_an_operator_never_raise_the_session_fence(node):
    """Finding: a MaxTransactionId read with session 10^12 raised the fence: STALE_SESSION for good. Under
    mutual TLS an operator's reads no longer raise it (without TLS every caller with the cluster key is trusted as
    a server: its reads fence, as a new owner's must)."""
    if node.tls_dir is None:
        pytest.skip("without TLS the cluster key is a server's credential (docs/security.md)")

    async def scenario():
        async with server(node, 5) as s, operator(node, HUGE) as o:
            await s.open()
            await o.open()
            ok(await s.ask("set_low_water_mark", low_water_mark=-1))
            ok(await s.append(0, records(0, 3)))
            ok(await o.ask("max_transaction_id", session_id=HUGE))
            ok(await o.ask("last_session_info", session_id=HUGE))
            ok(await o.ask("record_list", session_id=HUGE, transaction_id=0, max_records=3))
            ok(await s.append(0, records(3, 1)))  # session 5 goes on

    node.call(scenario())
    assert node.node.manager.partition(0).fence.highest_session_id == 5


def test_a_new_sessions_first_read_fences_the_old_session_out(node):
    """Why the server role's reads raise the fence: an old owner, frozen while a new owner's recovery read the
    replicas, must not then append a batch that the recovery (which did not see it) truncates after the old owner
    told its clients it committed. The new session's first read shuts session 5 out."""

    async def scenario():
        async with server(node, 5) as old, server(node, 6) as new:
            await old.open()
            await new.open()
            ok(await old.ask("set_low_water_mark", low_water_mark=-1))
            ok(await old.append(0, records(0, 3)))
            ok(await new.ask("max_transaction_id"))  # the new owner's recovery reads
            refused(await old.append(0, records(3, 1)), Code.STALE_SESSION)

    node.call(scenario())
    assert node.node.manager.partition(0).fence.highest_session_id == 6


def test_an_operator_resets_a_poisoned_fence(node):
    """Finding: SetLowWaterMark with session 10^12 poisoned the fence and no command reset it."""

    async def poison():
        async with server(node, 5) as s:
            await s.open()
            ok(await s.ask("set_low_water_mark", low_water_mark=-1))
            ok(await s.append(0, records(0, 3)))
            ok(await s.ask("set_low_water_mark", low_water_mark=2, session_id=HUGE))
            refused(await s.ask("set_low_water_mark", low_water_mark=2, session_id=6), Code.STALE_SESSION)

    node.call(poison())
    with admin(node) as a:
        with pytest.raises(StorageAdminError, match="unwritable") as writable:
            a.reset_fence(0, 5)
        assert writable.value.code == Code.PARTITION_UNAVAILABLE
        a.set_writable(0, False)
        with pytest.raises(StorageAdminError, match="nothing to reset"):
            a.reset_fence(0, HUGE)
        a.reset_fence(0, 5)
        a.set_writable(0, True)
        (state,) = [p for p in a.list_partitions() if p.partition_id == 0]
    assert (state.fence_session_id, state.session_id, state.low_water_mark) == (5, 5, 2)
    assert node.node.manager.partition(0).last_session_info().session_id == 5  # in the control file too

    async def recover():
        async with server(node, 6) as s:
            await s.open()
            ok(await s.ask("set_low_water_mark", low_water_mark=2))
            ok(await s.append(0, records(3, 1)))

    node.call(recover())
    assert node.node.manager.partition(0).fence.highest_session_id == 6


def test_digests_compare_replicas_records(node):
    async def scenario():
        async with server(node, 1) as c:
            await c.open()
            for pid in (0, 1):
                ok(await c.append(pid, records(0, 10)))
            ok(await c.ask("truncate", partition_id=1, transaction_id=6))
            forged = record(7, client_id=99)
            ok(await c.append(1, [forged]))
            ok(await c.append(1, records(8, 2)))

    node.call(scenario())
    with admin(node) as a:
        same = a.digest(0, 0, 7), a.digest(1, 0, 7)
        assert same[0].record_count == 7 and same[0].digest == same[1].digest
        whole = a.digest(0, 0, 100), a.digest(1, 0, 100)
        assert whole[0].record_count == whole[1].record_count == 10 and whole[0].digest != whole[1].digest
        assert a.digest(0, 7, 1).digest != a.digest(1, 7, 1).digest
        assert (whole[0].max_transaction_id, whole[0].low_water_mark) == (9, -1)
        assert a.digest(0, 10, 5).record_count == 0
        with pytest.raises(StorageAdminError, match="at least one record"):
            a.digest(0, 0, 0)


def test_the_cluster_key_is_never_told(node, caplog):
    """Finding: without TLS the Open error printed the real cluster key, and the log wrote it on every refusal."""
    other = uuid.uuid4()
    caplog.set_level(logging.DEBUG)

    async def scenario():
        async with server(node, 1) as c:
            message = refused(await c.open(key=other), Code.CLUSTER_KEY_MISMATCH, "another cluster key")
            assert str(KEY) not in message and str(other) not in message
            message = refused(await c.open(num_partitions=4), Code.CLUSTER_KEY_MISMATCH, "4 partitions")
            assert str(KEY) not in message

    node.call(scenario())
    with pytest.raises(StorageAdminError) as admin_refused:
        StorageAdminClient("127.0.0.1", node.servers.admin_port, str(other), 3, tls_files=node.tls_files("operator"))
    assert str(KEY) not in str(admin_refused.value) and str(other) not in str(admin_refused.value)
    assert "refused an Open" in caplog.text
    assert str(KEY) not in caplog.text and str(other) not in caplog.text
