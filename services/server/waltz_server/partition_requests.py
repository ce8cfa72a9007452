"""A partition's answers to the stream requests of its clients' mounts: Mount, Feed Request, Flush, a stream's end.

The seed's promise lives here: a mount completes, and a flush is answered, only once the partition holds no
pending append of that client, and only under the client's current mount of a ready partition at its generation.
"""

from __future__ import annotations

from collections.abc import Callable

from waltz.v1 import common_pb2, server_pb2
from waltz_server.append_pipeline import ClientPending
from waltz_server.feed import StreamPort, mount_response
from waltz_server.feed_cursor import FeedCursor
from waltz_server.mounts import MountRegistry
from waltz_server.partition_feeds import PartitionFeeds


class MountedRequests:
    """Partition's mount, feed, flush and detach, over the state the Partition keeps (declared here)."""

    partition_id: int
    generation: int
    feeds: PartitionFeeds
    _mounts: MountRegistry
    _pending: ClientPending[Callable[[], None]]
    _closed: bool

    @property
    def ready(self) -> bool:
        raise NotImplementedError

    def flush(self, stream: StreamPort, request: server_pb2.FlushRequest) -> None:
        """Answer the high-water mark once every earlier append of the client has resolved.

        Only a flush under the client's current mount here is answered so: its appends are the ones this
        partition counts. Any other (another generation, another stream, a partition reopened here and
        still recovering) may be about appends of an earlier owner whose outcome only the new owner's
        recovery and feed will tell; a flush answer would let the client take them for failed. It gets an
        unasked NOT_READY for its ReqId instead: mount again.
        """
        req_id = request.req_id
        if not self._answers_under_mount(stream, req_id):
            return

        def answer() -> None:
            flushed = server_pb2.FlushResponse(req_id=req_id, transaction_id=self.feeds.high_water_mark)
            stream.send_control(server_pb2.ServerMessage(flush=flushed))

        if self._pending.add_waiter(req_id.client_id, answer):
            answer()

    def _answers_under_mount(self, stream: StreamPort, req_id: common_pb2.ReqId) -> bool:
        """Whether a request is under the client's current mount of this ready partition at its generation;
        if not, the client is told NOT_READY for its ReqId."""
        if self.ready and req_id.generation == self.generation and self._mounts.is_current(
            req_id.client_id, stream.stream_id
        ):
            return True
        stream.send_control(mount_response(req_id, server_pb2.MountResponse.NOT_READY, self.feeds.high_water_mark))
        return False

    def mount(self, stream: StreamPort, request: server_pb2.MountRequest) -> None:
        """Register the stream, flush the client's appends, feed the catch-up, then answer."""
        req_id = request.req_id
        if not self.ready or req_id.generation != self.generation:
            stream.send_control(mount_response(req_id, server_pb2.MountResponse.NOT_READY, self.feeds.high_water_mark))
            return
        accepted, replaced = self._mounts.register(
            req_id.client_id, stream.stream_id, req_id.generation, request.seq_num
        )
        if not accepted:  # a stale network client
            message = (
                f"partition {self.partition_id}: a newer stream of client {req_id.client_id} mounted the partition "
                f"(this mount's seq_num {request.seq_num} is lower)"
            )
            stream.send_control(
                mount_response(req_id, server_pb2.MountResponse.SUPERSEDED, self.feeds.high_water_mark, message)
            )
            return
        if replaced is not None:
            self.feeds.end(replaced, superseded=True)
        self.feeds.end(stream.stream_id)

        def start() -> None:
            if self._closed or not self._mounts.is_current(req_id.client_id, stream.stream_id):
                return
            hwm = self.feeds.high_water_mark
            if request.client_high_water_mark > hwm:
                stream.send_control(mount_response(req_id, server_pb2.MountResponse.CLIENT_AHEAD, hwm))
                return
            cursor = FeedCursor(request.client_high_water_mark + 1, ready_at=hwm)
            self.feeds.start(stream, cursor, req_id, inline_max_bytes=request.inline_data_max_bytes)

        if self._pending.add_waiter(req_id.client_id, start):
            start()

    def feed(self, stream: StreamPort, request: server_pb2.FeedRequest) -> None:
        """Restart this stream's feed from the client's high-water mark (under the client's current mount here;
        any other gets an unasked NOT_READY for its ReqId: mount again)."""
        req_id = request.req_id
        if not self._answers_under_mount(stream, req_id):
            return
        current = self.feeds.get(stream.stream_id)
        ready_at = current.cursor.ready_at if current is not None else None
        mount_req_id = current.mount_req_id if current is not None else None
        mount = current.mount if current is not None else None
        self.feeds.end(stream.stream_id)
        cursor = FeedCursor(request.client_high_water_mark + 1, ready_at)
        self.feeds.start(stream, cursor, mount_req_id, mount, request.inline_data_max_bytes)

    def detach(self, stream: StreamPort) -> None:
        """The stream ended: forget its mounts and end its feed."""
        self._mounts.remove_stream(stream.stream_id)
        self.feeds.end(stream.stream_id)
