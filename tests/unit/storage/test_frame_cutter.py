"""The framed session port's frame cutter (waltz_storage.frame_cutter): frames cut from chunks however the stream
is split, a length above the limit, and the end of the stream between frames or inside one."""

from __future__ import annotations

import pytest

from waltz_common import frames
from waltz_storage.frame_cutter import FrameCutter


def frame(body: bytes) -> bytes:
    return len(body).to_bytes(4, "big") + body


BODIES = [b"first", b"", b"x" * 300, bytes(range(256)) * 3, b"last"]
STREAM = b"".join(frame(body) for body in BODIES)


def cut(chunks: list[bytes], limit: int = 1 << 20) -> FrameCutter:
    cutter = FrameCutter(limit)
    for chunk in chunks:
        cutter.feed(chunk)
    return cutter


def taken(cutter: FrameCutter) -> list[bytes]:
    got = []
    while cutter.frames:
        got.append(cutter.pop())
    return got


def test_several_frames_in_one_chunk_are_all_cut_in_order():
    cutter = cut([STREAM])
    assert cutter.queued_bytes == len(STREAM) == cutter.buffered_bytes
    assert taken(cutter) == BODIES
    assert cutter.queued_bytes == 0 and not cutter.backlog and cutter.error is None


def test_a_stream_split_at_any_byte_gives_the_same_frames():
    for split in range(1, len(STREAM)):
        assert taken(cut([STREAM[:split], STREAM[split:]])) == BODIES, split


def test_a_stream_fed_byte_by_byte_and_in_three_uneven_chunks_gives_the_same_frames():
    assert taken(cut([STREAM[i:i + 1] for i in range(len(STREAM))])) == BODIES
    assert taken(cut([STREAM[:3], STREAM[3:700], STREAM[700:]])) == BODIES


def test_frames_are_taken_while_the_next_one_is_still_arriving():
    cutter = cut([STREAM[:12]])  # "first" (9 bytes), the empty frame (4 bytes) not complete yet
    assert taken(cutter) == [b"first"]
    assert cutter.backlog and cutter.buffered_bytes == 3 and cutter.queued_bytes == 0
    cutter.feed(STREAM[12:])
    assert taken(cutter) == BODIES[1:]


def test_backlog_says_whether_any_byte_of_a_later_frame_has_arrived():
    cutter = FrameCutter(1 << 20)
    assert not cutter.backlog
    cutter.feed(frame(b"one") + frame(b"two")[:1])
    assert cutter.backlog
    assert cutter.pop() == b"one"
    assert cutter.backlog  # one byte of the next frame's length prefix
    cutter.feed(frame(b"two")[1:])
    assert cutter.pop() == b"two"
    assert not cutter.backlog


def test_a_length_above_the_limit_keeps_the_frames_before_it_and_takes_nothing_after():
    cutter = cut([frame(b"ok") + (101).to_bytes(4, "big")[:2], (101).to_bytes(4, "big")[2:] + b"y" * 50], limit=100)
    assert isinstance(cutter.error, frames.FrameTooLarge)
    assert str(cutter.error) == "a frame of 101 bytes is above the limit of 100 bytes"
    cutter.feed(frame(b"later"))
    assert taken(cutter) == [b"ok"]
    assert cutter.buffered_bytes == 0


def test_a_frame_at_the_limit_is_taken():
    assert taken(cut([frame(b"z" * 100)], limit=100)) == [b"z" * 100]


def test_the_end_between_frames_is_clean():
    cutter = cut([STREAM])
    cutter.end()
    assert cutter.ended and cutter.error is None
    cutter.feed(frame(b"after the end"))
    assert taken(cutter) == BODIES


@pytest.mark.parametrize(
    ("tail", "message"),
    [
        (b"\x00\x00", "the stream ended inside a frame's length prefix"),
        (b"\x00\x00\x01\x00" + b"x" * 10, "the stream ended 10 bytes into a frame of 256 bytes"),
        (b"\x00\x00\x01\x00", "the stream ended 0 bytes into a frame of 256 bytes"),
    ],
)
def test_an_end_inside_a_frame_is_an_error_after_the_frames_before_it(tail, message):
    cutter = cut([frame(b"whole"), tail])
    cutter.end()
    assert type(cutter.error) is frames.FrameError and str(cutter.error) == message
    assert taken(cutter) == [b"whole"]
    assert cutter.buffered_bytes == 0


def test_a_body_that_arrives_as_one_chunk_after_its_length_is_taken_without_a_copy():
    body = b"b" * 60_000  # a large frame whose length came alone (a writer that sent it with a write of its own)
    cutter = cut([frame(b"before") + frame(body)[:4], body, frame(b"after")])
    assert taken(cutter) == [b"before", body, b"after"]
    cutter = cut([frame(body)[:4], body])
    assert cutter.pop() is body
