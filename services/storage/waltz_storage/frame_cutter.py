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
        partial = self._partial
        if not partial:  # most chunks start a frame: cut them as they are, with one copy per frame
            taken = self._cut(data)
            if taken < len(data):
                partial += memoryview(data)[taken:]
            return
        partial += data
        with memoryview(partial) as view:
            taken = self._cut(view)
        del partial[:taken]

    def _cut(self, data: bytes | memoryview) -> int:
        """Queue the complete frames at the start of data; how many of its bytes they took (all of them from a
        length above the limit on: self.error says so)."""
        frames = self.frames
        limit = self.max_frame_bytes
        size_of = int.from_bytes
        available = len(data)
        start = 0
        while available - start >= HEADER_BYTES:
            size = size_of(data[start:start + HEADER_BYTES], "big")
            if size > limit:
                self.error = FrameTooLarge(f"a frame of {size} bytes is above the limit of {limit} bytes")
                return available
            stop = start + HEADER_BYTES + size
            if stop > available:
                break
            frames.append(bytes(data[start + HEADER_BYTES:stop]))
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
