"""Streamed HTTP/1.1 POSTs over asyncio's own streams, for the benchmark's measuring client: the request written as
bytes, the status line and headers read once, and the body's lines read from its chunks (or to its length, or to the
connection's close) with no per-read object, event or state machine of an HTTP library in between.

httpx (with httpcore, h11 and anyio under it) spent 0.4 to 0.5 s of CPU on a round of 32 streams of 128 tokens, about
a quarter of a core beside the service it measured on a 2-core machine; the client's CPU is the same machine's CPU
the service is measured on, so what it spends the service does not get. Connections are kept between requests (and
rounds), as the `openai` and httpx clients of a running application keep theirs.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from urllib.parse import urlsplit

HEADER_LIMIT = 64 * 1024  # the longest status line and headers a response may have


@dataclass
class Connection:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter

    def close(self) -> None:
        self.writer.close()


class StreamResponse:
    """A response whose body is read as lines (`lines()`), once; its connection goes back to the pool when the body
    has been read to its end and the server keeps it open."""

    def __init__(self, pool: ConnectionPool, connection: Connection, status: int, headers: dict[str, str]) -> None:
        self.status_code = status
        self.headers = headers  # names lower-cased
        self._pool = pool
        self._connection = connection
        self._is_done = False

    async def lines(self) -> AsyncIterator[str]:
        """The body's lines, without their line ends."""
        pending = b""
        async for data in self._body():
            pending += data
            if b"\n" not in data:
                continue
            *complete, pending = pending.split(b"\n")
            for line in complete:
                yield line.rstrip(b"\r").decode()
        if pending:
            yield pending.rstrip(b"\r").decode()

    def close(self) -> None:
        """Drops the connection unless its body was read to the end (a response left mid-body cannot be reused)."""
        if not self._is_done:
            self._finish(keep=False)

    async def _body(self) -> AsyncIterator[bytes]:
        reader = self._connection.reader
        if self.headers.get("transfer-encoding", "").lower() == "chunked":
            while True:
                size = int((await reader.readline()).split(b";", 1)[0], 16)
                if size == 0:
                    while (await reader.readline()) not in (b"\r\n", b"\n", b""):  # trailers, then the blank line
                        pass
                    break
                data = await reader.readexactly(size + 2)  # and its CRLF
                yield data[:-2]
        elif "content-length" in self.headers:
            yield await reader.readexactly(int(self.headers["content-length"]))
        else:  # read to the close
            while data := await reader.read(65536):
                yield data
            self._finish(keep=False)
            return
        self._finish(keep=self.headers.get("connection", "").lower() != "close")

    def _finish(self, keep: bool) -> None:
        self._is_done = True
        if keep:
            self._pool.put_back(self._connection)
        else:
            self._connection.close()


class ConnectionPool:
    """Connections to one server, opened as needed and kept when idle; used on one event loop."""

    def __init__(self, base_url: str) -> None:
        parts = urlsplit(base_url)
        self._host = parts.hostname or "127.0.0.1"
        self._port = parts.port or 80
        self._idle: list[Connection] = []

    async def post_stream(self, path: str, body: dict, headers: dict[str, str]) -> StreamResponse:
        payload = json.dumps(body, separators=(",", ":")).encode()
        head = [
            f"POST {path} HTTP/1.1",
            f"Host: {self._host}:{self._port}",
            "Content-Type: application/json",
            f"Content-Length: {len(payload)}",
            "Accept: text/event-stream",
            *(f"{name}: {value}" for name, value in headers.items()),
        ]
        request = ("\r\n".join(head) + "\r\n\r\n").encode() + payload
        while self._idle:  # a kept connection the server may have closed meanwhile: then a new one
            connection = self._idle.pop()
            try:
                return await self._exchange(connection, request)
            except (ConnectionError, asyncio.IncompleteReadError):
                connection.close()
        reader, writer = await asyncio.open_connection(self._host, self._port, limit=HEADER_LIMIT)
        return await self._exchange(Connection(reader, writer), request)

    def put_back(self, connection: Connection) -> None:
        self._idle.append(connection)

    def close(self) -> None:
        for connection in self._idle:
            connection.close()
        self._idle.clear()

    async def _exchange(self, connection: Connection, request: bytes) -> StreamResponse:
        connection.writer.write(request)
        await connection.writer.drain()
        head = await connection.reader.readuntil(b"\r\n\r\n")
        if not head:
            raise ConnectionResetError("the server closed the connection")
        status_line, *header_lines = head.decode("latin-1").split("\r\n")
        headers = {}
        for line in header_lines:
            name, separator, value = line.partition(":")
            if separator:
                headers[name.strip().lower()] = value.strip()
        return StreamResponse(self, connection, int(status_line.split(" ", 2)[1]), headers)
