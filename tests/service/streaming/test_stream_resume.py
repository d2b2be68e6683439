"""Streams that survive a real disconnect: a client that drops and comes back within STREAM_RESUME_GRACE_S (the test
stack's is short) gets exactly the rest and the request ends normally; nobody coming back cancels it after the
grace; an explicit cancel stops it at once. The README's resume example runs as written."""

from __future__ import annotations

import re
import time
from typing import Any

import httpx
import pytest
import redis
import requests

from scripts.stack import Stack
from tasks.config import REPO_ROOT
from tasks.streams.redis_keys import RedisKeys
from tests.service.http import auth
from tests.service.sse import Frame, data_frames, read_frames
from tests.service.streaming.test_streams import events

SAMPLINGS = {"greedy": {"temperature": 0}, "seeded": {"temperature": 0.9, "seed": 1234}}


def chat_body(stack: Stack, max_tokens: int, sampling: dict[str, Any]) -> dict[str, Any]:
    messages = [{"role": "user", "content": "tell me about cats"}]
    return {"model": stack.config.model_name, "messages": messages, "max_tokens": max_tokens, "ignore_eos": True,
            "stream_options": {"include_usage": True}, **sampling}  # fmt: skip


def readme_example() -> dict[str, Any]:
    """The README's resume example as written: its functions, not its `__main__` part."""
    blocks = re.findall(r"```python\n(.*?)```", (REPO_ROOT / "README.md").read_text(), re.DOTALL)
    [block] = [block for block in blocks if "def chat_resuming" in block]
    namespace: dict[str, Any] = {"__name__": "readme_example"}
    exec(compile(block, "README.md", "exec"), namespace)
    return namespace


def record_of(stack: Stack, request_id: str) -> dict[str, Any]:
    return requests.get(f"{stack.base_url}/v1/requests/{request_id}", headers=auth(stack), timeout=10).json()


def wait_until_detached(stack: Stack, request_id: str) -> None:
    """Until the api has noticed the drop: its relay left the stream's readers and set the grace."""
    client = redis.Redis.from_url(stack.config.redis_url, decode_responses=True)
    keys = RedisKeys(stack.config.redis_prefix)
    deadline = time.monotonic() + 10
    while client.zcard(keys.stream_attachers(request_id)) or client.zscore(keys.detached_streams(), request_id) is None:
        assert time.monotonic() < deadline, "the api never noticed the client leave"
        time.sleep(0.05)


def start_and_drop(stack: Stack, body: dict[str, Any], num_frames: int) -> list[Frame]:
    """The first `num_frames` data frames of a new stream, after which the client closes its socket."""
    url = f"{stack.base_url}/v1/chat/completions"
    response = requests.post(url, json={**body, "stream": True}, headers=auth(stack), stream=True, timeout=120)
    frames = (frame for frame in read_frames(response) if frame.data is not None)
    first = [next(frames) for _ in range(num_frames)]
    response.close()
    return first


@pytest.mark.parametrize("sampling", SAMPLINGS.values(), ids=SAMPLINGS.keys())
def test_the_readme_example_resumes_to_the_text_of_an_unbroken_stream(stack: Stack, sampling: dict) -> None:
    chat_resuming = readme_example()["chat_resuming"]
    body = chat_body(stack, 300, sampling)
    with httpx.Client(base_url=stack.base_url, headers=auth(stack), timeout=120) as client:
        # Dropping after more events than there are reads it all; resuming after [DONE] then gets [DONE] at once.
        unbroken = chat_resuming(client, body, drop_after=10**6)
        resumed = chat_resuming(client, body, drop_after=5)
    assert unbroken[1] == "length" and len(unbroken[0]) > 100
    assert resumed == unbroken


@pytest.mark.parametrize("sampling", SAMPLINGS.values(), ids=SAMPLINGS.keys())
def test_a_client_back_within_the_grace_gets_exactly_the_rest(stack: Stack, sampling: dict) -> None:
    first = start_and_drop(stack, chat_body(stack, 3500, sampling), num_frames=5)
    request_id = first[0].json["id"]
    wait_until_detached(stack, request_id)
    time.sleep(0.5)  # an immediate cancel would have taken effect by now (cancel flags are polled every 50 ms)
    assert record_of(stack, request_id)["status"] == "running"
    rest = events(stack, request_id, first[-1].event_id)
    assert first + rest == events(stack, request_id, None)  # nothing lost, nothing repeated
    record = record_of(stack, request_id)
    assert record["status"] == "completed" and record["response"]["choices"][0]["finish_reason"] == "length"
    assert record["response"]["usage"]["completion_tokens"] == 3500


def test_nobody_back_within_the_grace_cancels_the_request(stack: Stack) -> None:
    # Four long choices: several times the grace to generate, so only a cancel ends it this soon.
    first = start_and_drop(stack, {**chat_body(stack, 4000, SAMPLINGS["greedy"]), "n": 4}, num_frames=4)
    dropped_at = time.monotonic()
    request_id = first[0].json["id"]
    grace_s = stack.config.stream_resume_grace_s
    while (record := record_of(stack, request_id))["status"] == "running":
        assert time.monotonic() - dropped_at < grace_s + 30, "the request ran on after the grace"
        time.sleep(0.2)
    assert time.monotonic() - dropped_at >= grace_s, "cancelled before the grace ran out"
    assert record["status"] == "cancelled" and record["response"]["choices"][0]["finish_reason"] == "abort"
    assert record["response"]["usage"]["completion_tokens"] < 4 * 4000  # the worker aborted it in the engine


def test_an_explicit_cancel_stops_a_watched_stream_at_once(stack: Stack) -> None:
    url = f"{stack.base_url}/v1/chat/completions"
    body = {**chat_body(stack, 4000, SAMPLINGS["greedy"]), "stream": True}
    with requests.post(url, json=body, headers=auth(stack), stream=True, timeout=120) as response:
        frames = (frame for frame in read_frames(response) if frame.data is not None)
        request_id = next(frames).json["id"]
        next(frames)
        started = time.monotonic()
        cancelled = requests.post(f"{stack.base_url}/v1/requests/{request_id}/cancel", headers=auth(stack), timeout=10)
        rest = list(frames)
    assert cancelled.status_code == 200 and time.monotonic() - started < stack.config.stream_resume_grace_s
    finish = [frame.json["choices"][0]["finish_reason"] for frame in data_frames(rest[:-1]) if frame.json["choices"]]
    assert finish[-1] == "abort" and rest[-1].data == "[DONE]"
    assert record_of(stack, request_id)["status"] == "cancelled"
