"""A merged feed message (the server's coalesce of adjacent batches) as a Node client reads it: @grpc/grpc-js's
own deserializer for WaltzServer.Stream (@grpc/proto-loader over protobufjs 7, which keeps only the last
occurrence of a singular message field) must see every entry of every batch, in order."""

from __future__ import annotations

import base64
import json
import shutil
import subprocess

from tests.conformance.test_node_client import HERE, node_modules
from waltz.v1 import common_pb2, server_pb2
from waltz_server.client_stream import coalesce, stream_answer

READ = """
const path = require('path');
const loader = require('@grpc/proto-loader');
const grpc = require('@grpc/grpc-js');
const definition = loader.loadSync(['waltz/v1/server.proto'], {
  keepCase: true, longs: String, enums: String, defaults: true, oneofs: true,
  includeDirs: [path.resolve(process.argv[1], '..', '..', 'protos')],
});
const method = definition['waltz.v1.WaltzServer'].Stream;
const message = method.responseDeserialize(Buffer.from(process.argv[2], 'base64'));
console.log(JSON.stringify(message.feed.transactions.map((t) => Number(t.transaction_id))));
"""


def batch(*ids: int) -> server_pb2.ServerMessage:
    entries = [server_pb2.FeedData(req_id=common_pb2.ReqId(partition_id=0), transaction_id=i) for i in ids]
    return server_pb2.ServerMessage(feed=server_pb2.FeedDataBatch(transactions=entries))


def test_the_node_client_reads_every_entry_of_a_merged_feed_message() -> None:
    node = shutil.which("node")
    assert node is not None, "node is missing: run scripts/bootstrap (it installs Node.js)"
    node_modules()
    ((payload, _last),) = coalesce([batch(0, 1), batch(2), batch(3, 4, 5)], 100)
    encoded = base64.b64encode(stream_answer(payload)).decode()
    out = subprocess.run(
        [node, "-e", READ, str(HERE), encoded], cwd=HERE, capture_output=True, text=True, timeout=60, check=True
    )
    assert json.loads(out.stdout) == [0, 1, 2, 3, 4, 5]
