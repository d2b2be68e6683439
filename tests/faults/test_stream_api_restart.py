"""The api killed (SIGKILL) while it relays two streams, and started again: the client that reconnects within the
grace gets exactly the rest of its stream and its request ends normally; the request nobody came back for is
cancelled by the worker's reaper once the grace has passed, with no api process left that relayed it."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import requests

from scripts.stack import Stack, launcher_key
from tests.conftest import make_test_config
from tests.service.http import auth
from tests.service.sse import Frame, read_frames
from tests.service.streaming.test_streams import events

GRACE_S = 20.0  # the api must be back within GRACE_S - 5: a busy machine took over 10 s to restart gunicorn
MAX_TOKENS = 4000
NUM_CHOICES = 4  # long choices of the resumed request; the abandoned one has 12 (the test stack's MAX_NUM_SEQS: 16)


@pytest.fixture
def stack(tiny_model_dir: Path, redis_url: str, tmp_path: Path) -> Iterator[Stack]:
    database_url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    # Every entry of a stream kept (four choices of 4,000 tokens pass the default STREAM_MAXLEN), to replay it all.
    config = make_test_config(tiny_model_dir, redis_url, database_url, stream_resume_grace_s=GRACE_S,
                              sse_heartbeat_s=0.5, stream_maxlen=100_000)  # fmt: skip
    running = Stack(config, log_dir=tmp_path / "logs", api_key=launcher_key(config, "test-admin"))
    running.start()
    yield running
    running.stop()


def open_stream(stack: Stack, num_choices: int) -> tuple[requests.Response, Iterator[Frame]]:
    messages = [{"role": "user", "content": "tell me about cats"}]
    body = {"model": stack.config.model_name, "messages": messages, "max_tokens": MAX_TOKENS, "n": num_choices,
            "ignore_eos": True, "temperature": 0, "stream": True}  # fmt: skip
    url = f"{stack.base_url}/v1/chat/completions"
    response = requests.post(url, json=body, headers=auth(stack), stream=True, timeout=120)
    return response, (frame for frame in read_frames(response) if frame.data is not None)


def record_of(stack: Stack, request_id: str) -> dict[str, Any]:
    return requests.get(f"{stack.base_url}/v1/requests/{request_id}", headers=auth(stack), timeout=10).json()


def restart_api(stack: Stack) -> None:
    api = stack.process("api")
    os.killpg(api.popen.pid, signal.SIGKILL)  # gunicorn's master and its worker, mid-stream
    api.popen.wait()
    stack.restart(api)
    deadline = time.monotonic() + GRACE_S - 5
    while True:
        try:
            requests.get(f"{stack.base_url}/health", timeout=1).raise_for_status()
            return
        except requests.RequestException:
            assert time.monotonic() < deadline, "the api took too long to start again for this test's grace"
            time.sleep(0.1)


def test_a_stream_outlives_its_api_and_an_abandoned_one_is_cancelled_without_it(stack: Stack) -> None:
    resumed_response, resumed_frames = open_stream(stack, NUM_CHOICES)
    abandoned_response, abandoned_frames = open_stream(stack, 3 * NUM_CHOICES)  # far past the grace to generate
    first = [next(resumed_frames) for _ in range(5)]
    abandoned_id = next(abandoned_frames).json["id"]
    killed_at = time.monotonic()
    restart_api(stack)
    resumed_response.close()
    abandoned_response.close()

    request_id = first[0].json["id"]
    with ThreadPoolExecutor(1) as pool:  # the resumed client reads on while the abandoned request is watched
        rest = pool.submit(events, stack, request_id, first[-1].event_id)
        while (abandoned := record_of(stack, abandoned_id))["status"] == "running":
            assert time.monotonic() - killed_at < GRACE_S + 30, "the abandoned request ran on after the grace"
            time.sleep(0.2)
        abandoned_after_s = time.monotonic() - killed_at
        assert first + rest.result() == events(stack, request_id, None)  # nothing lost, nothing repeated
    assert abandoned["status"] == "cancelled", abandoned["status"]
    assert abandoned_after_s >= GRACE_S, f"cancelled {abandoned_after_s:.1f} s after the kill, within the grace"
    record = record_of(stack, request_id)
    assert record["status"] == "completed"
    assert record["response"]["usage"]["completion_tokens"] == NUM_CHOICES * MAX_TOKENS
