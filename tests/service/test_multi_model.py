"""Two models behind one api, each on its own CPU worker: both answer by name from their own worker (chat,
completions and a batch's lines), /v1/models lists both, and after one worker is SIGKILLed the other model keeps
serving while the dead one answers 503 at once and leaves /v1/models."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
import requests
import sqlalchemy

from scripts.stack import Stack, launcher_key
from tasks.config import REPO_ROOT
from tasks.streams.worker_leases import live_workers, num_live_workers
from tests.conftest import make_test_config
from tests.service.batch_helpers import chat_line, read_jsonl, submit, wait_for_end
from tests.service.http import auth

DRAFT = "tiny-draft"
LEASE_S = 1.5
SECOND_MODEL_TRAIN_STEPS = 8  # what the second model writes does not matter here, only which worker runs it


@pytest.fixture(scope="module")
def tiny_draft_dir(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A second model to serve: one layer with the tiny model's tokenizer, as `make draft-model` builds, but barely
    trained (seconds, where the Makefile's full build takes a minute on an idle 2-core machine and many on a busy
    one); the build itself is tested in tests/scripts/test_build_tiny_model.py."""
    out = tmp_path_factory.mktemp("second-model") / DRAFT
    command = [sys.executable, "-m", "scripts.build_tiny_model", "--out", str(out), "--num-layers", "1"]
    options = ["--tokenizer-from", str(tiny_model_dir), "--train-steps", str(SECOND_MODEL_TRAIN_STEPS)]
    subprocess.run([*command, *options], cwd=REPO_ROOT, check=True)
    return out


@pytest.fixture(scope="module")
def two_models(
    tiny_model_dir: Path, tiny_draft_dir: Path, redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    database_url = f"sqlite:///{tmp_path_factory.mktemp('multi-model') / 'db.sqlite'}"
    served = f"tiny={tiny_model_dir},{DRAFT}={tiny_draft_dir}"
    config = make_test_config(
        tiny_model_dir, redis_url, database_url, served_models=served, worker_lease_s=LEASE_S, kv_cache_tokens=4096
    )
    stack = Stack(config, log_dir=tmp_path_factory.mktemp("multi-model-logs"), api_key=launcher_key(config, "admin"))
    stack.start()
    yield stack
    stack.stop()


def listed_models(stack: Stack) -> list[str]:
    reply = requests.get(f"{stack.base_url}/v1/models", headers=auth(stack), timeout=10)
    assert reply.status_code == 200
    return [model["id"] for model in reply.json()["data"]]


def complete(stack: Stack, model: str) -> requests.Response:
    body = {"model": model, "prompt": "the cat", "max_tokens": 4, "temperature": 0}
    return requests.post(f"{stack.base_url}/v1/completions", json=body, headers=auth(stack), timeout=120)


def model_of_worker_that_ran(stack: Stack, request_id: str) -> str:
    """The model of the worker recorded on the request's row, from the live-worker registry."""
    engine = sqlalchemy.create_engine(stack.config.database_url)
    try:
        with engine.connect() as connection:
            query = sqlalchemy.text("SELECT worker FROM requests WHERE id = :id")
            worker = connection.execute(query, {"id": request_id}).scalar_one()
    finally:
        engine.dispose()
    client = redis.Redis.from_url(stack.config.redis_url, decode_responses=True)
    return {live.name: live.model for live in live_workers(client, stack.config)}[worker]


def test_each_model_answers_by_name_from_its_own_workers(two_models: Stack) -> None:
    stack = two_models
    assert listed_models(stack) == ["tiny", DRAFT]
    for model in ("tiny", DRAFT):
        reply = complete(stack, model)
        assert reply.status_code == 200, reply.text
        assert reply.json()["model"] == model and reply.json()["usage"]["completion_tokens"] >= 1
        assert model_of_worker_that_ran(stack, reply.json()["id"]) == model
        chat = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
        chat_reply = requests.post(f"{stack.base_url}/v1/chat/completions", json=chat, headers=auth(stack), timeout=120)
        assert chat_reply.status_code == 200 and chat_reply.json()["model"] == model
    unknown = complete(stack, "no-such-model")
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "model_not_found"
    retrieved = requests.get(f"{stack.base_url}/v1/models/{DRAFT}", headers=auth(stack), timeout=10)
    assert retrieved.status_code == 200 and retrieved.json()["id"] == DRAFT


def test_a_batch_runs_on_its_models_workers_and_keeps_to_one_model(two_models: Stack) -> None:
    stack = two_models
    lines = [chat_line(stack, f"line-{i}", model=DRAFT) for i in range(3)] + [chat_line(stack, "other", model="tiny")]
    batch = wait_for_end(stack, submit(stack, lines))
    assert batch.status == "completed" and batch.model == DRAFT
    assert (batch.request_counts.completed, batch.request_counts.failed) == (3, 1)
    outputs = read_jsonl(stack, batch.output_file_id)
    assert sorted(line["custom_id"] for line in outputs) == ["line-0", "line-1", "line-2"]
    assert all(line["response"]["body"]["model"] == DRAFT for line in outputs)
    [error] = read_jsonl(stack, batch.error_file_id)
    assert error["custom_id"] == "other" and error["error"]["code"] == "model_mismatch"


def test_a_killed_models_worker_leaves_the_other_serving_and_its_model_refused_fast(two_models: Stack) -> None:
    stack = two_models
    worker = stack.process(f"worker-{DRAFT}-0")
    worker.popen.send_signal(signal.SIGKILL)
    killed_at = time.monotonic()
    worker.popen.wait()
    stack.processes.remove(worker)  # the stack's other children must stay alive for it
    client = redis.Redis.from_url(stack.config.redis_url)
    deadline = time.monotonic() + 3 * LEASE_S
    while num_live_workers(client, stack.config, DRAFT) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert num_live_workers(client, stack.config, DRAFT) == 0, "the dead worker's lease outlived it"

    started = time.monotonic()
    refused = complete(stack, DRAFT)
    refused_in_s = time.monotonic() - started
    assert refused.status_code == 503 and refused_in_s < 2, f"{refused.status_code} after {refused_in_s:.1f} s"
    after_kill_s = started - killed_at
    print(f"{DRAFT}: 503 {after_kill_s:.1f} s after the kill (lease {LEASE_S} s), in {refused_in_s * 1000:.0f} ms")
    error = refused.json()["error"]
    assert (error["type"], error["code"]) == ("service_unavailable", "no_worker_available")
    assert set(error) == {"message", "type", "param", "code"} and int(refused.headers["Retry-After"]) > 0
    assert listed_models(stack) == ["tiny"]
    missing = requests.get(f"{stack.base_url}/v1/models/{DRAFT}", headers=auth(stack), timeout=10)
    assert missing.status_code == 404
    assert complete(stack, "tiny").status_code == 200
