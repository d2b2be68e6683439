"""A lean streaming client for benchmarks: every stream of a round on one asyncio loop over one pool of raw HTTP/1.1
connections (`bench/service/http_stream.py`), reading raw SSE lines, so that the measuring client costs little beside
the service it measures (the `openai` client, a thread per stream, parsed every chunk into objects and took a large
share of the two cores; httpx's async client, a quarter of a core at 32 streams).

The loop and the pool last from the client's first round to its `close()`, so a round's streams reuse the
connections the rounds before opened, as the `openai` and httpx clients of a running application do: a TTFT here is a
request's, not a TCP handshake's and a new connection's accept in the server. A round wider than every one before
opens the connections it lacks.

A stream asks for `return_token_ids`, so every token makes a chunk whether or not it adds text (a random-init model's
tokens rarely do): the first token's time is its first chunk with token ids, and the tokens are counted from the
usage chunk and checked against the ids received.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass

from bench.service.http_stream import ConnectionPool, StreamResponse
from bench.workload import BenchRequest

ADMISSION_RETRIES = 4  # a 429 (a burst wider than the admission gate's slots) is retried after its hint, as openai does


@dataclass(frozen=True)
class StreamTiming:
    num_tokens: int
    ttft_s: float  # from the round's start to the first chunk with token ids


@dataclass(frozen=True)
class RoundTiming:
    wall_s: float
    client_cpu_s: float  # this process's CPU time over the round: the measuring client's own cost
    streams: list[StreamTiming]

    @property
    def tokens_per_s(self) -> float:
        return sum(stream.num_tokens for stream in self.streams) / self.wall_s


class StreamClient:
    """One loop and one connection pool for all its rounds; `close()` (or leaving its `with`) closes both."""

    def __init__(self, base_url: str, api_key: str, model: str) -> None:
        self._headers = {"Authorization": f"Bearer {api_key}"}
        self._model = model
        self._loop = asyncio.new_event_loop()
        # no cap on connections: a round's streams all start at once, each on a connection of its own; idle ones are
        # kept for the next round (the server may close one meanwhile: gunicorn's keepalive here is 30 s)
        self._pool = ConnectionPool(base_url)  # used on self._loop only

    def __enter__(self) -> StreamClient:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def close(self) -> None:
        if not self._loop.is_closed():
            self._pool.close()
            self._loop.close()

    def run_round(self, requests: list[BenchRequest]) -> RoundTiming:
        """Every request streamed at once."""
        return self._loop.run_until_complete(self._round(requests))

    async def _round(self, requests: list[BenchRequest]) -> RoundTiming:
        cpu_start, start = time.process_time(), time.perf_counter()
        streams = await asyncio.gather(*(self._stream(request, start) for request in requests))
        return RoundTiming(time.perf_counter() - start, time.process_time() - cpu_start, list(streams))

    async def _stream(self, request: BenchRequest, start: float) -> StreamTiming:
        body = self.request_body(request)
        for attempt in range(ADMISSION_RETRIES + 1):
            response = await self._pool.post_stream("/v1/completions", body, self._headers)
            try:
                if response.status_code == 429 and attempt < ADMISSION_RETRIES:
                    await asyncio.sleep(_retry_after_s(response.headers))
                    continue
                if response.status_code != 200:
                    text = "\n".join([line async for line in response.lines()])
                    raise RuntimeError(f"{request.request_id}: HTTP {response.status_code}: {text[:500]}")
                return await self.read_stream(response, request, start)
            finally:
                response.close()
        raise AssertionError("the last attempt returns or raises")

    def request_body(self, request: BenchRequest) -> dict:
        """The streamed completion as this service takes it (a peer server's client overrides this and read_stream)."""
        return {
            "model": self._model,
            "prompt": request.prompt_token_ids,
            "max_tokens": request.num_output_tokens,
            "temperature": 0,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
            "return_token_ids": True,
        }

    async def read_stream(self, response: StreamResponse, request: BenchRequest, start: float) -> StreamTiming:
        return await _read(response, request, start)


def _retry_after_s(headers: dict[str, str]) -> float:
    """The hint as the `openai` client reads it: retry-after-ms first, then Retry-After in seconds."""
    if "retry-after-ms" in headers:
        return float(headers["retry-after-ms"]) / 1000
    return float(headers.get("retry-after", "0.5"))


async def _read(response: StreamResponse, request: BenchRequest, start: float) -> StreamTiming:
    first_token_at, num_ids, num_tokens = None, 0, None
    async for line in response.lines():
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        chunk = json.loads(line[len("data: ") :])
        if "error" in chunk:
            raise RuntimeError(f"{request.request_id}: {chunk['error']}")
        for choice in chunk["choices"]:
            if choice.get("token_ids") and first_token_at is None:
                first_token_at = time.perf_counter() - start
            num_ids += len(choice.get("token_ids") or ())
        if chunk.get("usage"):
            num_tokens = chunk["usage"]["completion_tokens"]
    if first_token_at is None or num_tokens != num_ids or num_tokens != request.num_output_tokens:
        raise RuntimeError(
            f"{request.request_id}: usage {num_tokens}, {num_ids} token ids, expected {request.num_output_tokens}"
        )
    return StreamTiming(num_tokens, first_token_at)
