"""Pure pieces of the client shell: configuration, the builder, wire conversions, lazy data."""

import threading

import pytest

from waltz.v1 import server_pb2
from waltz_client.api import FedTransaction, JsonSerializer, Transaction, TransactionBuilder
from waltz_client.config import ClientConfig
from waltz_client.locks import PartitionLocalLock
from waltz_client.wire import fill_append_request, message_partitions, req_id_from_proto, req_id_to_proto
from waltz_common.config import ConfigError
from waltz_common.types import INT32_MAX, ReqId, crc32


def test_config_defaults_follow_the_original_and_need_zookeeper_only_for_real_clusters() -> None:
    config = ClientConfig.of({"zookeeper.connectString": "127.0.0.1:2181", "cluster.root": "/waltz/a"})
    assert (config.max_concurrent_transactions, config.long_wait_threshold_s, config.mount_timeout_s) == (20, 5.0, 10.0)
    assert config.auto_mount is True and config.max_retries == -1 and config.request_timeout_s == 30.0
    with pytest.raises(ConfigError, match=r"zookeeper\.connectString"):
        ClientConfig.of({})
    mock = ClientConfig.of({"client": {"autoMount": "false", "longWaitThresholdSeconds": 0.25}},
                           zookeeper_required=False)
    assert mock.auto_mount is False and mock.long_wait_threshold_s == 0.25
    with pytest.raises(ConfigError, match="unknown"):
        ClientConfig.of({"client.maxConcurentTransactions": 3}, zookeeper_required=False)
    with pytest.raises(ValueError, match="at least 1"):
        ClientConfig.of({"client.maxConcurrentTransactions": 0}, zookeeper_required=False)


def test_client_callback_thread_defaults_to_the_thread_and_takes_booleans_only() -> None:
    assert ClientConfig.of({}, zookeeper_required=False).callback_thread is True
    assert ClientConfig.of({"client.callbackThread": False}, zookeeper_required=False).callback_thread is False
    assert ClientConfig.of({"client": {"callbackThread": "no"}}, zookeeper_required=False).callback_thread is False
    with pytest.raises(ConfigError, match=r"client\.callbackThread"):
        ClientConfig.of({"client.callbackThread": "sometimes"}, zookeeper_required=False)


def test_builder_hashes_locks_checksums_data_and_bounds_the_header() -> None:
    builder = TransactionBuilder(partition_id=1, client_high_water_mark=7)
    builder.set_data({"b": 1, "a": [2]}, JsonSerializer())
    assert builder.data == b'{"a":[2],"b":1}' and builder.checksum == crc32(builder.data)
    lock = PartitionLocalLock("account", 3)
    builder.set_write_locks([lock, lock])
    builder.set_read_locks([PartitionLocalLock("x", 1)])
    assert builder.write_locks == [lock.lock_hash]
    builder.set_header(INT32_MAX)
    with pytest.raises(ValueError):
        builder.set_header(INT32_MAX + 1)
    with pytest.raises(TypeError):
        builder.set_data("text without a serializer")
    request = server_pb2.AppendRequest()
    fill_append_request(request, ReqId(1, 2, 1, 9), builder)
    assert request.write_lock_request_length == 1 and request.read_lock_request_length == 1
    assert request.append_lock_request_length == 0 and request.data_length == len(builder.data)
    assert request.client_high_water_mark == 7 and req_id_from_proto(request.req_id) == ReqId(1, 2, 1, 9)


def test_lock_lists_are_made_on_first_use_and_what_is_put_in_them_is_sent() -> None:
    builder = TransactionBuilder(partition_id=0, client_high_water_mark=-1)
    assert not builder.takes_locks()
    assert builder.read_locks == [] and not builder.takes_locks()  # read: an empty list, still no lock
    builder.append_locks.append(PartitionLocalLock("parent", 1).lock_hash)  # a list like any other
    builder.write_locks = [5]
    assert builder.takes_locks()
    request = server_pb2.AppendRequest()
    fill_append_request(request, ReqId(1, 0, 0, 1), builder)
    assert list(request.append_locks) == builder.append_locks and request.append_lock_request_length == 1
    assert list(request.write_locks) == [5] and request.read_lock_request_length == 0
    plain = server_pb2.AppendRequest()
    fill_append_request(plain, ReqId(1, 0, 0, 2), TransactionBuilder(0, -1))
    assert not plain.write_locks and not plain.read_locks and not plain.append_locks


def test_server_messages_go_to_their_partition_a_feed_batch_to_its_first_entry_s() -> None:
    def entry(pid: int, txn: int) -> server_pb2.FeedData:
        return server_pb2.FeedData(req_id=req_id_to_proto(ReqId(1, 0, pid, 0)), transaction_id=txn)

    feed = server_pb2.ServerMessage(feed=server_pb2.FeedDataBatch(transactions=[entry(0, 1), entry(0, 2), entry(3, 1)]))
    assert message_partitions(feed) == [(0, feed)]  # one partition per batch: partition 0 ignores the last
    flush = server_pb2.ServerMessage(flush=server_pb2.FlushResponse(req_id=req_id_to_proto(ReqId(1, 0, 4, 2))))
    assert message_partitions(flush) == [(4, flush)]
    assert message_partitions(server_pb2.ServerMessage()) == []
    one = server_pb2.ServerMessage(feed=server_pb2.FeedDataBatch(transactions=[entry(2, 1), entry(2, 2)]))
    assert message_partitions(one) == [(2, one)] and message_partitions(one)[0][1] is one  # not copied


def test_transaction_data_is_fetched_once_even_from_several_threads() -> None:
    calls = []

    def fetch() -> bytes:
        calls.append(1)
        return b'"hello"'

    txn = Transaction(0, 5, ReqId(1, 0, 0, 1), 0, fetch)
    threads = [threading.Thread(target=txn.data) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert calls == [1] and txn.data(JsonSerializer()) == "hello"
    assert Transaction(0, 6, ReqId(1, 0, 0, 2), 0, fetch, data=b"own").data() == b"own" and len(calls) == 1


def test_a_fed_transaction_makes_its_req_id_from_the_feed_entry_and_fetches_through_its_source() -> None:
    calls: list[tuple[int, int]] = []

    def source(partition_id: int, transaction_id: int) -> bytes:
        calls.append((partition_id, transaction_id))
        return b"fetched"

    entry = server_pb2.FeedData(req_id=req_id_to_proto(ReqId(7, 1, 3, 42)), transaction_id=9, header=5)
    txn = FedTransaction(3, 9, entry.req_id, entry.header, source, None)
    assert txn.req_id == ReqId(7, 1, 3, 42) and txn.req_id is txn.req_id  # converted once
    assert (txn.partition_id, txn.transaction_id, txn.header) == (3, 9, 5)
    assert txn.data() == b"fetched" and txn.data() == b"fetched" and calls == [(3, 9)]
    own = FedTransaction(3, 10, ReqId(7, 1, 3, 43), 0, source, b"own")
    assert own.data() == b"own" and own.req_id == ReqId(7, 1, 3, 43) and len(calls) == 1
    own.req_id = ReqId(1, 2, 3, 4)  # still an attribute an application may set
    assert own.req_id == ReqId(1, 2, 3, 4) and isinstance(own, Transaction)
