"""Frames cut from a byte stream as its chunks arrive: the pure core of the storage node's framed session port.

The wire format is waltz_common.frames' (a 4-byte big-endian length and that many bytes). A FrameCutter is fed
the chunks a connection receives, in order, and holds the complete frames until they are taken, the bytes of the
frame still incomplete, and what went wrong: a length above the limit (FrameTooLarge: nothing more of the stream
is taken; the frames before it stay to be served) or a stream that ended inside a frame (FrameError). No I/O: the
asyncio.Protocol that owns it (framed_connection.FramedConnection) feeds it and reads it.
"""

from __future__ import annotations

from collections import deque

from waltz_common.frames import HEADER_BYTES, FrameError, FrameTooLarge


class FrameCutter:
    """Complete frames from the chunks fed to it, in order; see the module's docstring."""

    def __init__(self, max_frame_bytes: int) -> None:
        self.max_frame_bytes = max_frame_bytes
        self.frames: deque[bytes] = deque()
        """Complete frames (their bodies) not taken yet, oldest first."""
        self.queued_bytes = 0
        """Bytes of the frames in self.frames, their length prefixes counted."""
        self.error: FrameError | None = None
        """Why the stream holds no more frames past self.frames (None: it is fine so far)."""
        self.ended = False
        """The stream has ended (end()): no more chunks."""
        self._partial = bytearray()  # the start of the next frame: fewer bytes than its prefix and length

    @property
    def buffered_bytes(self) -> int:
        """Bytes held: complete frames not taken yet and the start of the next one."""
        return self.queued_bytes + len(self._partial)

    @property
    def backlog(self) -> bool:
        """Whether bytes of a later frame have arrived (a complete frame, or part of one)."""
        return bool(self.frames) or bool(self._partial)

    def feed(self, data: bytes) -> None:
        """The next chunk of the stream. Ignored once the stream is bad or has ended."""
        if self.error is not None or self.ended:
            return
        start = self._complete(data) if self._partial else 0
        if start < 0:
            return
        # Most chunks start a frame: cut them as they are, one copy per frame (none for a chunk that is a frame's
        # whole body).
        taken = self._cut(data, start)
        if taken < len(data):
            self._partial += memoryview(data)[taken:]

    def _complete(self, data: bytes) -> int:
        """Complete the frame begun in self._partial from the start of data: where data's next frame begins, or -1
        when data was all taken (the frame is still incomplete, or its length is above the limit)."""
        partial = self._partial
        start = 0
        if len(partial) < HEADER_BYTES:
            start = min(HEADER_BYTES - len(partial), len(data))
            partial += data[:start]
            if len(partial) < HEADER_BYTES:
                return -1
            if self._too_large(int.from_bytes(partial, "big")):
                partial.clear()
                return -1
        size = int.from_bytes(partial[:HEADER_BYTES], "big")
        stop = start + HEADER_BYTES + size - len(partial)
        if stop > len(data):
            partial += memoryview(data)[start:]
            return -1
        if len(partial) == HEADER_BYTES:  # the length came alone (a large frame's header is written first)
            body = data[start:stop]  # no copy when the chunk is the whole body
        else:
            partial += memoryview(data)[start:stop]
            with memoryview(partial) as view:
                body = bytes(view[HEADER_BYTES:])
        self.frames.append(body)
        self.queued_bytes += HEADER_BYTES + size
        partial.clear()
        return stop

    def _too_large(self, size: int) -> bool:
        if size <= self.max_frame_bytes:
            return False
        self.error = FrameTooLarge(f"a frame of {size} bytes is above the limit of {self.max_frame_bytes} bytes")
        return True

    def _cut(self, data: bytes, start: int) -> int:
        """Queue the complete frames of data from start on; where the first incomplete one begins (len(data) from
        a length above the limit on: self.error says so)."""
        frames = self.frames
        limit = self.max_frame_bytes
        size_of = int.from_bytes
        available = len(data)
        while available - start >= HEADER_BYTES:
            size = size_of(data[start:start + HEADER_BYTES], "big")
            if size > limit:
                self._too_large(size)
                return available
            stop = start + HEADER_BYTES + size
            if stop > available:
                break
            frames.append(data[start + HEADER_BYTES:stop])
            self.queued_bytes += stop - start
            start = stop
        return start

    def pop(self) -> bytes:
        """The oldest complete frame's body (IndexError when there is none)."""
        frame = self.frames.popleft()
        self.queued_bytes -= HEADER_BYTES + len(frame)
        return frame

    def end(self) -> None:
        """The stream has ended: a frame begun and not complete makes it bad (FrameError)."""
        if self.ended:
            return
        self.ended = True
        partial = self._partial
        if self.error is not None or not partial:
            return
        if len(partial) < HEADER_BYTES:
            self.error = FrameError("the stream ended inside a frame's length prefix")
        else:
            size = int.from_bytes(partial[:HEADER_BYTES], "big")
            self.error = FrameError(
                f"the stream ended {len(partial) - HEADER_BYTES} bytes into a frame of {size} bytes"
            )
        partial.clear()
