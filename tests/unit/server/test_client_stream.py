"""Outbound coalescing of feed batches, and the bounded outbound queue."""

from __future__ import annotations

import asyncio

from waltz.v1 import common_pb2, server_pb2
from waltz_server.client_stream import Outbound, coalesce, stream_answer


def feed(partition_id: int, *ids: int) -> server_pb2.ServerMessage:
    entries = [server_pb2.FeedData(req_id=common_pb2.ReqId(partition_id=partition_id), transaction_id=i) for i in ids]
    return server_pb2.ServerMessage(feed=server_pb2.FeedDataBatch(transactions=entries))


def flush() -> server_pb2.ServerMessage:
    return server_pb2.ServerMessage(flush=server_pb2.FlushResponse(transaction_id=1))


def written(coalesced) -> list[server_pb2.ServerMessage]:
    """What the client reads from coalesce's output, each payload through the Stream's serializer (a merge's
    last message is the one whose last entry it ends with)."""
    out = []
    for payload, last in coalesced:
        message = server_pb2.ServerMessage.FromString(stream_answer(payload))
        if message.HasField("feed"):
            assert message.feed.transactions[-1] == last.feed.transactions[-1]
        else:
            assert payload is last
        out.append(message)
    return out


def shape(coalesced) -> list:
    return [
        [(f.req_id.partition_id, f.transaction_id) for f in m.feed.transactions] if m.HasField("feed") else "flush"
        for m in written(coalesced)
    ]


def test_adjacent_consecutive_batches_of_a_partition_merge_up_to_the_limit():
    messages = [feed(0, 1, 2), feed(0, 3), feed(1, 4), feed(1, 5), flush(), feed(1, 6), feed(1, 8), feed(1, 9, 10)]
    assert shape(coalesce(messages, 3)) == [
        [(0, 1), (0, 2), (0, 3)],
        [(1, 4), (1, 5)],
        "flush",
        [(1, 6)],
        [(1, 8), (1, 9), (1, 10)],
    ]


def test_a_merge_reads_back_as_the_batches_entries_in_order_with_every_field():
    # the merge is the batches' serializations joined: the client must read exactly their entries, inline data too
    def entry(i: int) -> server_pb2.FeedData:
        data = bytes([i]) * i
        return server_pb2.FeedData(req_id=common_pb2.ReqId(client_id=i % 3, generation=2, partition_id=4, seq_num=i),
                                   transaction_id=i, header=-i, has_data=i % 2 == 0, data=data, checksum=i * 7)

    batches = [[entry(i) for i in range(first, first + size)] for first, size in ((0, 3), (3, 1), (4, 5))]
    messages = [server_pb2.ServerMessage(feed=server_pb2.FeedDataBatch(transactions=b)) for b in batches]
    (merged,) = written(coalesce(messages, 100))
    assert list(merged.feed.transactions) == [e for b in batches for e in b]


def last_occurrence_wins(payload: bytes) -> server_pb2.ServerMessage:
    """payload parsed as a parser that keeps only the last occurrence of a singular message field (protobufjs 7,
    protobuf-c) reads it: one ServerMessage per top-level field, the last one read."""
    message, pos = server_pb2.ServerMessage(), 0
    while pos < len(payload):
        start = pos
        tag, pos = _read_varint(payload, pos)
        assert tag & 7 == 2, "every ServerMessage field is a message"
        length, pos = _read_varint(payload, pos)
        pos += length
        message = server_pb2.ServerMessage.FromString(payload[start:pos])
    return message


def _read_varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            return value, pos


def test_a_merge_reads_back_whole_in_a_parser_where_the_last_occurrence_of_a_message_field_wins():
    # joining whole ServerMessages repeats its singular feed field: protobufjs 7 (the Node client's) kept only the
    # last batch of a merge, losing the others' transactions without a sign
    messages = [feed(0, 1, 2), feed(0, 3), feed(0, 4, 5, 6)]
    ((payload, _last),) = coalesce(messages, 10)
    read = last_occurrence_wins(stream_answer(payload))
    assert [f.transaction_id for f in read.feed.transactions] == [1, 2, 3, 4, 5, 6]


def test_merging_never_changes_the_messages_given():
    # a realtime feed batch is one message shared by every stream it goes to
    messages = [feed(0, 1, 2), feed(0, 3), feed(0, 4), flush(), feed(0, 5), feed(0, 6)]
    before = [m.SerializeToString() for m in messages]
    assert shape(coalesce(messages, 10)) == [[(0, 1), (0, 2), (0, 3), (0, 4)], "flush", [(0, 5), (0, 6)]]
    assert [m.SerializeToString() for m in messages] == before


def test_outbound_holds_feeds_back_when_full_but_never_answers():
    async def scenario():
        outbound = Outbound(limit=2)
        outbound.put_nowait(flush())
        await outbound.put(feed(0, 1))
        waiting = asyncio.create_task(outbound.put(feed(0, 2)))
        await asyncio.sleep(0.01)
        assert not waiting.done()
        outbound.put_nowait(flush())  # answers are queued regardless
        assert len(outbound) == 3
        assert len(await outbound.take()) == 3
        await asyncio.wait_for(waiting, 5)
        assert [[e.transaction_id for e in m.feed.transactions] for m in await outbound.take()] == [[2]]
        outbound.close()
        await asyncio.wait_for(outbound.wait_room(), 5)

    asyncio.run(scenario())
