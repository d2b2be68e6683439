"""Concurrent HTTP requests to one worker share the engine's forward passes."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import redis
import requests

from scripts.stack import Stack
from tasks.streams.worker_stats import worker_stats_key
from tests.service.http import auth

NUM_CONCURRENT = 8
MAX_TOKENS = 48


def complete(stack: Stack, prompt: str) -> dict:
    body = {"model": stack.config.model_name, "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0,
            "ignore_eos": True}  # fmt: skip
    response = requests.post(f"{stack.base_url}/v1/completions", json=body, headers=auth(stack), timeout=120)
    assert response.status_code == 200, response.text
    return response.json()


def published_stats(stack: Stack) -> dict:
    client = redis.Redis.from_url(stack.config.redis_url, decode_responses=True)
    deadline = time.monotonic() + stack.config.worker_lease_s
    while time.monotonic() < deadline:
        keys = list(client.scan_iter(worker_stats_key(stack.config, "*")))
        if keys:
            return json.loads(client.get(keys[0]))
        time.sleep(0.2)
    pytest.fail("the worker published no engine stats")


def test_concurrent_requests_share_batches(stack: Stack) -> None:
    complete(stack, "warm up")
    started = time.perf_counter()
    solo = complete(stack, "the cat sat")
    solo_s = time.perf_counter() - started
    assert solo["usage"]["completion_tokens"] == MAX_TOKENS

    started = time.perf_counter()
    with ThreadPoolExecutor(NUM_CONCURRENT) as pool:
        replies = list(pool.map(lambda i: complete(stack, f"story number {i} begins"), range(NUM_CONCURRENT)))
    concurrent_s = time.perf_counter() - started

    assert all(reply["usage"]["completion_tokens"] == MAX_TOKENS for reply in replies)
    # one after another they would take NUM_CONCURRENT x solo; the speed itself is measured by bench/, not here
    assert concurrent_s < NUM_CONCURRENT * solo_s, (concurrent_s, solo_s)
    time.sleep(stack.config.worker_lease_s / 3)  # the next renewal carries the latest stats
    stats = published_stats(stack)["engine"]
    assert stats["max_batch_size_seen"] > 1
    assert sum(count for size, count in stats["batch_size_histogram"].items() if int(size) > 1) > 0
