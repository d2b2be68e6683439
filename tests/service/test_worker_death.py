"""A worker killed mid-generation loses nothing silently: its request fails with one error, clients hear of it
within a lease, and a new worker serves the next request."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from scripts.stack import Stack, launcher_key
from tests.conftest import make_test_config
from tests.service.http import auth
from tests.service.sse import read_frames


@pytest.fixture(scope="module")
def mortal_stack(tiny_model_dir: Path, redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    database_url = f"sqlite:///{tmp_path_factory.mktemp('death') / 'db.sqlite'}"
    config = make_test_config(tiny_model_dir, redis_url, database_url, worker_lease_s=1.5, sse_heartbeat_s=0.3)
    stack = Stack(config, log_dir=tmp_path_factory.mktemp("death-logs"), api_key=launcher_key(config, "test-admin"))
    stack.start()
    yield stack
    stack.stop()


def test_sigkilled_worker_fails_its_request_and_a_new_worker_serves(mortal_stack: Stack) -> None:
    stack = mortal_stack
    body = {
        "model": stack.config.model_name,
        "messages": [{"role": "user", "content": "tell me about cats"}],
        "max_tokens": 3000,
        "ignore_eos": True,
        "stream": True,
    }
    with requests.post(
        f"{stack.base_url}/v1/chat/completions", json=body, headers=auth(stack), stream=True, timeout=60
    ) as response:
        frames = (frame for frame in read_frames(response) if frame.data is not None)
        request_id = next(frames).json["id"]
        next(frames)
        stack.process("worker").popen.send_signal(signal.SIGKILL)
        killed_at = time.monotonic()
        rest = list(frames)
        noticed_after_s = time.monotonic() - killed_at
    assert rest[-1].data == "[DONE]"
    assert rest[-2].json["error"]["code"] == "worker_lost"
    assert noticed_after_s < 10, f"the client waited {noticed_after_s:.1f} s"
    record = requests.get(f"{stack.base_url}/v1/requests/{request_id}", headers=auth(stack), timeout=10).json()
    assert record["status"] == "failed" and record["error"]["code"] == "worker_lost"

    stack.processes.remove(stack.process("worker"))
    stack.start_worker()
    stack.wait_for_worker(120)  # until then a request is refused at once with 503 no_worker_available
    reply = requests.post(
        f"{stack.base_url}/v1/completions",
        json={"model": stack.config.model_name, "prompt": "the cat", "max_tokens": 4},
        headers=auth(stack),
        timeout=120,
    )
    assert reply.status_code == 200 and reply.json()["usage"]["completion_tokens"] >= 1
    again = requests.get(f"{stack.base_url}/v1/requests/{request_id}", headers=auth(stack), timeout=10).json()
    assert again["status"] == "failed", "the new worker must not rerun a request that already has its result"
