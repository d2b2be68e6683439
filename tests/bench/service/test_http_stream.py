"""The benchmark's raw HTTP/1.1 client against a real socket server: chunked bodies split anywhere, bodies of a known
length, kept connections reused, and a connection the server closed replaced."""

from __future__ import annotations

import asyncio
import itertools
import json

from bench.service.http_stream import ConnectionPool

CHUNKED_PIECES = [b'data: {"a"', b": 1}\n\nda", b"ta: [DONE]\n", b"\n"]


async def _serve(handler_log: list[dict], close_after: int | None = None) -> asyncio.Server:
    """Answers each POST with its JSON body's `mode`: `chunked` (SSE lines split across chunks) or `length`.
    Each connection is logged by its number in accept order: `id(writer)` is reused once a closed writer is freed."""
    connection_numbers = itertools.count()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connection = next(connection_numbers)
        served = 0
        while True:
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except asyncio.IncompleteReadError:
                break
            length = next(
                int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")
            )
            body = json.loads(await reader.readexactly(length))
            handler_log.append({"body": body, "connection": connection})
            if body["mode"] == "chunked":
                writer.write(
                    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Type: text/event-stream\r\n\r\n"
                )
                for piece in CHUNKED_PIECES:
                    writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                    await writer.drain()
                writer.write(b"0\r\n\r\n")
            else:
                payload = b'{"error": "busy"}'
                writer.write(
                    b"HTTP/1.1 429 Too Many Requests\r\nContent-Length: %d\r\nRetry-After: 0\r\n\r\n%s"
                    % (len(payload), payload)
                )
            await writer.drain()
            served += 1
            if close_after is not None and served >= close_after:
                break
        writer.close()

    return await asyncio.start_server(handle, "127.0.0.1", 0)


def test_lines_of_a_chunked_stream_and_a_kept_connection() -> None:
    async def run() -> None:
        log: list[dict] = []
        server = await _serve(log)
        port = server.sockets[0].getsockname()[1]
        pool = ConnectionPool(f"http://127.0.0.1:{port}")
        for _ in range(2):
            response = await pool.post_stream("/v1/completions", {"mode": "chunked"}, {"Authorization": "Bearer k"})
            assert response.status_code == 200
            assert [line async for line in response.lines()] == ['data: {"a": 1}', "", "data: [DONE]", ""]
            response.close()
        busy = await pool.post_stream("/v1/completions", {"mode": "length"}, {})
        assert (busy.status_code, busy.headers["retry-after"]) == (429, "0")
        assert [line async for line in busy.lines()] == ['{"error": "busy"}']
        assert len({entry["connection"] for entry in log}) == 1, "one connection, kept between requests"
        pool.close()
        server.close()

    asyncio.run(run())


def test_a_connection_the_server_closed_is_replaced() -> None:
    async def run() -> None:
        log: list[dict] = []
        server = await _serve(log, close_after=1)
        port = server.sockets[0].getsockname()[1]
        pool = ConnectionPool(f"http://127.0.0.1:{port}")
        for _ in range(3):
            response = await pool.post_stream("/", {"mode": "chunked"}, {})
            assert [line async for line in response.lines()][-2] == "data: [DONE]"
            await asyncio.sleep(0.01)  # the server's close reaches the kept connection
        assert len({entry["connection"] for entry in log}) == 3
        pool.close()
        server.close()

    asyncio.run(run())
