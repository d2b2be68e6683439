"""Redis restarted under load, with and without AOF: the worker and the api stay up and reconnect on their own,
every request that was in flight ends with exactly one result or one error, and new requests run within 10 s. Each
request's event stream then ends, read from its start or resumed with Last-Event-ID: every frame once, in order,
one final event and [DONE], even where the worker's final XADD was lost with Redis.

The restart comes while the worker decodes and its consumer waits on an empty queue, every message unacknowledged:
the moment at which kombu's Redis transport used to end the worker (see tasks/redis_transport.py)."""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
import sqlalchemy

from scripts.stack import Stack
from tests.conftest import make_test_config
from tests.faults.redis_server import RestartableRedis
from tests.service.sse import Frame, data_frames, read_frames

TERMINAL = {"completed", "failed", "cancelled"}
logger = logging.getLogger(__name__)


@pytest.fixture(params=["no-aof", "aof"])
def redis_and_stack(
    request: pytest.FixtureRequest, tiny_model_dir: Path, tmp_path: Path
) -> Iterator[tuple[RestartableRedis, Stack]]:
    server = RestartableRedis(tmp_path, append_only=request.param == "aof")
    server.start()
    config = make_test_config(tiny_model_dir, server.url, f"sqlite:///{tmp_path / 'db.sqlite'}")
    stack = Stack(config, log_dir=tmp_path / "logs")
    stack.start()
    yield server, stack
    stack.stop()
    server.kill()


def long_chat(stack: Stack, index: int, *, stream: bool) -> requests.Response:
    body = {
        "model": stack.config.model_name,
        "messages": [{"role": "user", "content": f"tell me about cats {index}"}],
        "max_tokens": 800,
        "ignore_eos": True,
        "stream": stream,
    }
    response = requests.post(f"{stack.base_url}/v1/chat/completions", json=body, stream=stream, timeout=60)
    response.content  # noqa: B018 - read to the end: a stream ends in its final event or an error
    return response


def request_statuses(database_url: str) -> dict[str, str]:
    engine = sqlalchemy.create_engine(database_url)
    try:
        with engine.connect() as connection:
            return dict(connection.execute(sqlalchemy.text("SELECT id, status FROM requests")).fetchall())
    finally:
        engine.dispose()


def test_redis_restart_under_load_loses_nothing(redis_and_stack: tuple[RestartableRedis, Stack]) -> None:
    server, stack = redis_and_stack
    threads = [threading.Thread(target=long_chat, args=(stack, i), kwargs={"stream": i % 2 == 0}) for i in range(12)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 30
    while sum(status == "running" for status in request_statuses(stack.config.database_url).values()) < 12:
        assert time.monotonic() < deadline, "the requests never started"
        time.sleep(0.1)
    time.sleep(1)  # into steady decoding
    server.kill()
    time.sleep(3)
    server.start()
    for thread in threads:
        thread.join(90)

    assert stack.dead_process() is None, "a process of the stack exited when Redis restarted"
    started = time.monotonic()
    reply = None
    while time.monotonic() - started < 10:
        reply = requests.post(
            f"{stack.base_url}/v1/completions",
            json={"model": stack.config.model_name, "prompt": "the cat", "max_tokens": 4},
            timeout=10,
        )
        if reply.status_code == 200:
            break
        assert reply.status_code == 503 and reply.headers["Retry-After"], reply.text
        time.sleep(0.5)
    assert reply is not None and reply.status_code == 200, "no request ran within 10 s of Redis coming back"
    served_after_s = time.monotonic() - started

    deadline = time.monotonic() + 60  # the ledger: every accepted request ended, with one result or one error
    while open_ := {i: s for i, s in request_statuses(stack.config.database_url).items() if s not in TERMINAL}:
        assert time.monotonic() < deadline, f"requests left open: {open_}"
        time.sleep(0.2)
    ledger = dict(collections.Counter(request_statuses(stack.config.database_url).values()))
    message = "Redis restart: ledger %s; a new request served %.1f s after the in-flight ones ended"
    logger.info(message, ledger, served_after_s)

    if server.is_append_only:  # without it every stream is gone: GET .../events answers `stream_expired`
        request_ids = request_statuses(stack.config.database_url)
        slowest_s = max(assert_events_end_once(stack, request_id) for request_id in request_ids)
        logger.info("Redis restart: every request's events ended, the slowest read in %.1f s", slowest_s)


def assert_events_end_once(stack: Stack, request_id: str) -> float:
    """Reads the request's events from the start, then resumed from its second frame; returns the longer read's
    seconds."""
    started = time.monotonic()
    frames = events_of(stack, request_id, None)
    ids = [frame.event_id for frame in frames]
    assert frames[-1].data == "[DONE]" and len(set(ids)) == len(ids) and ids == sorted(ids, key=frame_order), ids
    errors = [index for index, frame in enumerate(frames[:-1]) if "error" in frame.json]
    assert errors in ([], [len(frames) - 2]), frames  # at most one error, and it is the final event
    if len(frames) > 2:
        assert events_of(stack, request_id, frames[0].event_id) == frames[1:]
    return time.monotonic() - started


def events_of(stack: Stack, request_id: str, last_event_id: str | None, timeout_s: float = 20) -> list[Frame]:
    """Every frame of GET /v1/requests/{id}/events, which must end within `timeout_s`."""
    headers = {} if last_event_id is None else {"Last-Event-ID": last_event_id}
    url = f"{stack.base_url}/v1/requests/{request_id}/events"
    deadline = time.monotonic() + timeout_s
    frames = []
    with requests.get(url, headers=headers, stream=True, timeout=10) as response:
        assert response.status_code == 200, response.text
        for frame in read_frames(response):
            assert time.monotonic() < deadline, f"the events of {request_id} did not end: {data_frames(frames)[-3:]}"
            frames.append(frame)
    return data_frames(frames)


def frame_order(event_id: str | None) -> tuple[int, ...]:
    """A frame id `<ms>-<seq>` or `<ms>-<seq>:<frames sent>` as numbers in stream order."""
    assert event_id is not None
    entry, _, sent = event_id.partition(":")
    milliseconds, sequence = entry.split("-")
    return int(milliseconds), int(sequence), int(sent) if sent else 1 << 62
