"""One api process (the real gunicorn entry point, gevent) holds open SSE streams while `/health` and a new request are
answered within seconds (a frozen api took 12-20 s), both while the streams are being admitted and once they are all
open: 256 by default, 1,000 under `-m slow`. The streams are sent at once; the part of that burst the api cannot admit
within ADMISSION_WAIT_S gets 429 and retries, as the `openai` client does. The streams' requests wait in the queue of a
live worker that takes nothing, so they stay open for as long as the test holds them; bench/service/load.py ramps the
same through a whole stack."""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import redis

from bench.service.load import retry_after_of
from tasks.config import REPO_ROOT, Config
from tasks.store.db import upgrade_to_head
from tasks.streams.worker_leases import renew_worker_lease
from tests.conftest import make_test_config
from tests.faults.redis_server import RestartableRedis

logger = logging.getLogger(__name__)
BODY = {"model": "tiny", "prompt": "the cat", "max_tokens": 4, "stream": True}


@pytest.fixture
def api(tiny_model_dir: Path, tmp_path: Path) -> Iterator[Config]:
    server = RestartableRedis(tmp_path, append_only=False)  # its own: a session ending beside this one flushes its DB
    server.start()
    database_url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    upgrade_to_head(database_url)
    # A new request sent during the burst waits its turn in line, at most ADMISSION_WAIT_S: 2 s here (10 by default),
    # so that its bound below still tells a gate that holds it from a frozen api.
    config = make_test_config(
        tiny_model_dir,
        server.url,
        database_url,
        api_connections=2048,
        worker_lease_s=120.0,
        sse_heartbeat_s=15.0,
        admission_wait_s=2.0,
    )
    client = redis.Redis.from_url(server.url)
    renew_worker_lease(client, config, "busy-worker")  # alive, and never takes a request
    command = [sys.executable, "-m", "gunicorn", "-c", "python:api.gunicorn_conf", "api.app:create_app()"]
    env = {**os.environ, **config.to_env()}
    process = subprocess.Popen(command, cwd=REPO_ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 90
        while not _answers(config):
            assert process.poll() is None and time.monotonic() < deadline, "the api did not start"
            time.sleep(0.2)
        yield config
    finally:
        process.terminate()
        process.wait(30)
        server.kill()


def _answers(config: Config) -> bool:
    try:
        return httpx.get(f"http://{config.host}:{config.port}/health", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


@dataclass
class OpenStream:
    context: AbstractAsyncContextManager[httpx.Response]  # entered: the caller exits it
    response: httpx.Response
    num_refusals: int  # 429s before this answer


async def open_stream(client: httpx.AsyncClient, deadline: float) -> OpenStream:
    """One stream, opened as the `openai` client would: a 429 (the part of the burst the api could not admit within
    ADMISSION_WAIT_S) is retried after its Retry-After."""
    num_refusals = 0
    while True:
        stream = client.stream("POST", "/v1/completions", json=BODY)
        response = await stream.__aenter__()
        if response.status_code != 429 or time.monotonic() > deadline:
            return OpenStream(stream, response, num_refusals)
        num_refusals += 1
        await stream.__aexit__(None, None, None)
        await asyncio.sleep(retry_after_of(response))


@dataclass
class Probes:
    health_s: list[float]
    new_request_s: float
    new_request_status: int


async def probe(client: httpx.AsyncClient, num_health: int) -> Probes:
    """`/health` `num_health` times, 20 ms apart, then how long a new request waits for its answer."""
    health_s = []
    for _ in range(num_health):
        started = time.perf_counter()
        assert (await client.get("/health")).status_code == 200
        health_s.append(time.perf_counter() - started)
        await asyncio.sleep(0.02)
    started = time.perf_counter()
    async with client.stream("POST", "/v1/completions", json=BODY) as response:
        return Probes(health_s, time.perf_counter() - started, response.status_code)


async def hold_streams_and_probe(base_url: str, num_streams: int) -> tuple[list[int], Probes, Probes]:
    """Opens the streams at once, probing while they open (the burst) and once all are open (holding)."""
    limits = httpx.Limits(max_connections=num_streams + 8, max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=base_url, limits=limits, timeout=60) as client:
        deadline = time.monotonic() + 120
        # each admitted stream's headers arrive at once; its body waits for a worker that never comes
        opening = asyncio.gather(*(open_stream(client, deadline) for _ in range(num_streams)))
        await asyncio.sleep(0.2)  # the burst is under way
        during_burst = await probe(client, 10)
        streams = await opening
        statuses = collections.Counter(stream.response.status_code for stream in streams)
        assert statuses == {200: num_streams}, f"streams never admitted: {statuses}"
        refusals = [stream.num_refusals for stream in streams]
        holding = await probe(client, 30)
        for stream in streams:
            await stream.context.__aexit__(None, None, None)
        return refusals, during_burst, holding


@pytest.mark.parametrize("num_streams", [256, pytest.param(1000, marks=pytest.mark.slow)])
def test_open_streams_leave_health_and_admission_quick(api: Config, num_streams: int) -> None:
    refusals, during_burst, holding = asyncio.run(hold_streams_and_probe(f"http://{api.host}:{api.port}", num_streams))
    logger.info("%d streams at once: 429s per stream %s", num_streams, dict(collections.Counter(refusals)))
    # Bounds a frozen api misses by seconds (a thread per stream left /health waiting 20 s; a burst admitted all at
    # once, before the admission gate, held a new request 12.5 s and /health over 10 s), loose enough for a shared
    # 2-core machine that other work keeps busy. During the burst this client's own event loop is busy opening the
    # streams, so those probes carry its delay too. The tight targets are bench/service/load.py's, which probes from a
    # process of its own (docs/RELIABILITY.md has its numbers).
    assert max(during_burst.health_s) < 5.0, f"/health took {max(during_burst.health_s):.3f} s during the burst"
    assert during_burst.new_request_status in (200, 429) and during_burst.new_request_s < 5.0
    assert max(holding.health_s) < 3.0, f"/health took {max(holding.health_s):.3f} s with the streams open"
    assert holding.new_request_status == 200 and holding.new_request_s < 5.0, f"{holding.new_request_s:.2f} s"
