"""waltz_common.frames.write_frame: a small frame goes as one buffer with its length, a large one as its length and
its data in one writelines (one writev on uvloop: never a send of the 4-byte length on its own)."""

from __future__ import annotations

import asyncio

from waltz_common import frames


class Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[str, list[bytes]]] = []

    def write(self, data: bytes, /) -> None:
        self.calls.append(("write", [data]))

    def writelines(self, data: list[bytes], /) -> None:
        self.calls.append(("writelines", list(data)))


def test_a_small_frame_is_one_write_with_its_length():
    out = Recorder()
    frames.write_frame(out, b"abc")
    assert out.calls == [("write", [b"\x00\x00\x00\x03abc"])]


def test_a_large_frame_is_one_writelines_of_its_length_and_its_data_as_they_are():
    data = b"d" * (64 * 1024)
    out = Recorder()
    frames.write_frame(out, data)
    ((call, pieces),) = out.calls
    assert call == "writelines" and pieces[0] == (64 * 1024).to_bytes(4, "big") and pieces[1] is data


def test_a_frame_written_to_a_stream_reads_back_whole():
    async def scenario():
        received = asyncio.get_running_loop().create_future()

        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            received.set_result([await frames.read_frame(reader, 1 << 20) for _ in range(2)])
            writer.close()

        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        async with server:
            _, writer = await asyncio.open_connection("127.0.0.1", server.sockets[0].getsockname()[1])
            frames.write_frame(writer, b"small")
            frames.write_frame(writer, b"L" * 100_000)
            await writer.drain()
            assert await asyncio.wait_for(received, 10) == [b"small", b"L" * 100_000]
            writer.close()

    asyncio.run(scenario())
