"""Chat is never starved by a batch: chunk tasks hold at most BATCH_CHUNKS_IN_FLIGHT of a worker's threads, so a
chat request finds a free thread (and the engine) while long batch lines run."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
import requests

from scripts.stack import Stack, launcher_key
from tests.conftest import make_test_config
from tests.service.batch_helpers import chat_line, client_for, submit, wait_for_end, wait_until
from tests.service.http import auth


@pytest.fixture(scope="module")
def few_threads(tiny_model_dir: Path, redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    database_url = f"sqlite:///{tmp_path_factory.mktemp('priority') / 'db.sqlite'}"
    config = make_test_config(
        tiny_model_dir, redis_url, database_url, worker_concurrency=4, batch_chunk_size=1, batch_chunks_in_flight=2
    )
    stack = Stack(config, log_dir=tmp_path_factory.mktemp("priority-logs"), api_key=launcher_key(config, "test-admin"))
    stack.start()
    yield stack
    stack.stop()


def test_chat_is_answered_while_long_batch_lines_hold_their_threads(few_threads: Stack) -> None:
    stack = few_threads
    batch_id = submit(stack, [chat_line(stack, f"long-{i}", max_tokens=4000, ignore_eos=True) for i in range(8)])
    wait_until(stack, batch_id, lambda batch: batch.status == "in_progress", timeout_s=30)
    queued = redis.Redis.from_url(stack.config.redis_url).llen(stack.config.bulk_queue_of(stack.config.model_name))
    assert queued <= stack.config.batch_chunks_in_flight, "only the window of chunks is ever on the queue"
    body = {"model": stack.config.model_name, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    for _ in range(6):  # more chats than the worker has threads: each must find a thread free of bulk work
        started = time.monotonic()
        reply = requests.post(f"{stack.base_url}/v1/chat/completions", json=body, headers=auth(stack), timeout=60)
        assert reply.status_code == 200 and time.monotonic() - started < 10
    assert client_for(stack).batches.retrieve(batch_id).status == "in_progress"
    client_for(stack).batches.cancel(batch_id)
    assert wait_for_end(stack, batch_id, timeout_s=60).status == "cancelled"
