"""The store layer's small pure parts: settings and keys, backoff, Signal, metadata payloads, wire conversions."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from waltz.v1 import metadata_pb2, storage_pb2
from waltz_common.config import Config
from waltz_common.record_layout import RECORD_OVERHEAD
from waltz_common.types import Record, ReqId, crc32
from waltz_server.store.api import NewRecord
from waltz_server.store.connection import seq_num_patch
from waltz_server.store.events import Signal, first_to_end
from waltz_server.store.metadata import groups_of, replicas_of
from waltz_server.store.settings import STORE_KEYS, Backoff, StoreSettings
from waltz_server.store.wire import append_pending_request, request_body
from waltz_server.validation import req_id_message
from waltz_storage.protocol import records_from_append


def test_store_keys_defaults_are_the_settings_defaults() -> None:
    assert StoreSettings.from_config(Config(STORE_KEYS, {})) == StoreSettings()
    names = {k.name for k in STORE_KEYS}
    assert names == {
        "storage.initialRetryInterval",
        "storage.maxRetryInterval",
        "storage.checkpointInterval",
        "storage.requestTimeoutSeconds",
        "storage.catchUpBatchSize",
        "storage.replicaLagTimeout",
        "storage.maxReplicaBacklogBytes",
        "storage.keepaliveTime",
        "storage.damageCheckIntervalSeconds",
        "storage.useSessionPort",
    }


def test_settings_from_config_converts_milliseconds_and_rejects_nonsense() -> None:
    config = Config(
        STORE_KEYS,
        {
            "storage": {
                "initialRetryInterval": 50,
                "maxRetryInterval": 400,
                "checkpointInterval": 9,
                "replicaLagTimeout": 2500,
            }
        },
    )
    settings = StoreSettings.from_config(config)
    assert (
        settings.initial_retry_interval_s,
        settings.max_retry_interval_s,
        settings.checkpoint_interval,
        settings.replica_lag_timeout_s,
    ) == (0.05, 0.4, 9, 2.5)
    with pytest.raises(ValueError):
        StoreSettings(initial_retry_interval_s=1.0, max_retry_interval_s=0.5)
    with pytest.raises(ValueError):
        StoreSettings(checkpoint_interval=0)
    with pytest.raises(ValueError):
        StoreSettings(replica_lag_timeout_s=0)


def test_backoff_doubles_up_to_the_max_and_resets() -> None:
    backoff = Backoff.of(StoreSettings(initial_retry_interval_s=0.1, max_retry_interval_s=0.5))
    assert [backoff.next_delay() for _ in range(5)] == [0.1, 0.2, 0.4, 0.5, 0.5]
    backoff.reset()
    assert backoff.next_delay() == 0.1


def test_signal_wakes_waiters_and_never_misses_a_notify_before_the_wait() -> None:
    async def test() -> None:
        signal = Signal()
        version = signal.version
        signal.notify()
        await asyncio.wait_for(signal.wait_past(version), 1)  # already past: returns at once
        waiter = asyncio.create_task(signal.wait_past(signal.version))
        await asyncio.sleep(0)
        assert not waiter.done()
        signal.notify()
        await asyncio.wait_for(waiter, 1)

    asyncio.run(test())


def test_first_to_end_returns_or_raises_as_the_first_and_cancels_the_rest() -> None:
    async def test() -> None:
        cancelled: list[str] = []

        async def forever(name: str) -> None:
            try:
                await asyncio.Event().wait()
            finally:
                cancelled.append(name)

        async def fail() -> None:
            await asyncio.sleep(0)
            raise ValueError("refused")

        await first_to_end(asyncio.sleep(0), forever("a"))
        assert cancelled == ["a"]
        with pytest.raises(ValueError, match="refused"):
            await first_to_end(forever("b"), fail())
        assert cancelled == ["a", "b"]

    asyncio.run(test())


def test_first_to_end_lets_a_cancellation_through_even_as_a_coro_fails() -> None:
    """What a 3.11 TaskGroup does not: cancelled in the turn its child failed, it raised the child's
    error and the caller's retry loop went on (tests/unit/server/store/test_store_session_refused_replica.py)."""

    async def test() -> None:
        outcomes = set()
        for hops in range(6):

            async def fail() -> None:
                await asyncio.sleep(0)
                raise ValueError("refused")

            async def retrying() -> None:
                while True:
                    with contextlib.suppress(ValueError):
                        await first_to_end(asyncio.Event().wait(), fail())

            task = asyncio.create_task(retrying())
            for _ in range(hops):
                await asyncio.sleep(0)
            task.cancel()
            done, _ = await asyncio.wait([task], timeout=1)
            outcomes.add(bool(done) and task.cancelled())
        assert outcomes == {True}

    asyncio.run(test())


def test_replicas_and_groups_come_from_the_zookeeper_payloads() -> None:
    assignments = metadata_pb2.ReplicaAssignments()
    assignments.storage_replicas.add(connect_string="a:1", replica_ids=[0, 1])
    assignments.storage_replicas.add(connect_string="b:1", replica_ids=[1])
    data = assignments.SerializeToString()
    assert replicas_of(data, 1) == {"a:1", "b:1"} and replicas_of(data, 0) == {"a:1"} and replicas_of(data, 2) == set()
    assert replicas_of(None, 0) == set()
    groups = metadata_pb2.GroupDescriptor()
    groups.groups.add(connect_string="a:1", group_id=3)
    assert groups_of(groups.SerializeToString()) == {"a:1": 3} and groups_of(b"") == {}


def test_records_round_trip_through_the_append_request() -> None:
    pending = NewRecord(req_id_message(ReqId(1, 2, 3, 4)), 5, b"data", crc32(b"data"))
    request = append_pending_request(7, 3, 10, [pending])
    body = request_body(request)
    assert (body.session_id, body.partition_id, body.record_list_length) == (7, 3, 1)
    assert not body.records and len(body.encoded_records) == RECORD_OVERHEAD + 4  # sent in the data file's layout
    assert records_from_append(body) == [Record(10, ReqId(1, 2, 3, 4), 5, b"data", crc32(b"data"))]


REQUEST_KINDS = [field.name for field in storage_pb2.StorageRequest.DESCRIPTOR.oneofs_by_name["request"].fields]


@pytest.mark.parametrize("seq", [1, 127, 128, 300, 2**31, 2**40, 2**63 - 1, -1])
@pytest.mark.parametrize("kind", REQUEST_KINDS)
def test_the_seq_num_patch_is_what_protobuf_encodes_for_every_request_kind(kind: str, seq: int) -> None:
    request = storage_pb2.StorageRequest()
    getattr(request, kind).SetInParent()
    expected = storage_pb2.StorageRequest()
    getattr(expected, kind).seq_num = seq
    assert seq_num_patch(request, seq) == expected.SerializeToString()


@pytest.mark.parametrize("seq", [0, 1, 300, 2**40])
def test_one_serialized_append_gets_each_replicas_seq_num_by_a_patch(seq: int) -> None:
    pending = [NewRecord(req_id_message(ReqId(1, 2, 3, i)), i, b"d%d" % i, crc32(b"d%d" % i)) for i in range(3)]
    request = append_pending_request(7, 3, 10, pending)
    parsed = storage_pb2.StorageRequest.FromString(request.SerializeToString() + seq_num_patch(request, seq))
    expected = storage_pb2.StorageRequest()
    expected.CopyFrom(request)
    expected.append.seq_num = seq
    assert parsed == expected
