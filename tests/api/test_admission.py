"""Admission on a real Redis and SQLite: no live worker is a fast 503, a full queue and a spent rate limit are 429s
with Retry-After, and none of them records anything; both are per served model; an admitted request carries the key's
x-ratelimit headers."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
import sqlalchemy
from flask.testing import FlaskClient

from api.app import create_app
from tasks.config import Config
from tasks.db import upgrade_to_head
from tasks.streams import renew_worker_lease
from tests.conftest import make_test_config

BODY = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "stream": True}


@pytest.fixture
def make_client(tiny_model_dir: Path, redis_url: str, tmp_path: Path) -> Iterator:
    configs: list[Config] = []

    def make(*, live_worker: bool = True, **overrides: object) -> tuple[Config, FlaskClient]:
        database_url = f"sqlite:///{tmp_path / f'db{len(configs)}.sqlite'}"
        upgrade_to_head(database_url)
        config = make_test_config(tiny_model_dir, redis_url, database_url, **overrides)
        configs.append(config)
        if live_worker:  # a lease and nothing consuming the queue: admitted requests stay queued
            renew_worker_lease(redis.Redis.from_url(redis_url), config, "idle-worker")
        return config, create_app(config).test_client()

    yield make
    client = redis.Redis.from_url(redis_url)
    for config in configs:
        for model in config.served_model_paths():
            client.delete(*config.for_model(model).worker_queues)
        for key in client.scan_iter(f"{config.redis_prefix}*"):
            client.delete(key)


def num_requests(config: Config) -> int:
    engine = sqlalchemy.create_engine(config.database_url)
    with engine.connect() as connection:
        return connection.execute(sqlalchemy.text("SELECT count(*) FROM requests")).scalar_one()


def test_no_live_worker_is_a_fast_503_that_records_nothing(make_client) -> None:  # type: ignore[no-untyped-def]
    config, client = make_client(live_worker=False)
    response = client.post("/v1/chat/completions", json=BODY)
    assert response.status_code == 503 and response.headers["Retry-After"]
    assert response.get_json()["error"]["code"] == "no_worker_available"
    assert num_requests(config) == 0


def test_a_full_queue_is_a_429_with_retry_after(make_client) -> None:  # type: ignore[no-untyped-def]
    config, client = make_client(max_queued_requests=2)
    open_streams = [client.post("/v1/chat/completions", json=BODY) for _ in range(2)]  # a dropped one cancels
    assert [response.status_code for response in open_streams] == [200, 200]
    refused = client.post("/v1/chat/completions", json=BODY)
    assert refused.status_code == 429 and int(refused.headers["Retry-After"]) >= 1
    assert refused.get_json()["error"] == {
        "message": refused.get_json()["error"]["message"],
        "type": "rate_limit_exceeded",
        "param": None,
        "code": "queue_full",
    }
    assert num_requests(config) == 2


def test_workers_and_queue_room_are_per_model(make_client, tiny_model_dir: Path) -> None:  # type: ignore[no-untyped-def]
    config, client = make_client(served_models=f"tiny={tiny_model_dir},twin={tiny_model_dir}", max_queued_requests=1)
    twin = {**BODY, "model": "twin"}
    refused = client.post("/v1/chat/completions", json=twin)
    assert refused.status_code == 503 and refused.get_json()["error"]["code"] == "no_worker_available"
    assert refused.headers["Retry-After"] and num_requests(config) == 0
    open_streams = [client.post("/v1/chat/completions", json=BODY)]  # tiny has its (idle) worker; a dropped one cancels
    assert client.post("/v1/chat/completions", json=BODY).status_code == 429  # and its queue is full
    renew_worker_lease(redis.Redis.from_url(config.redis_url), config.for_model("twin"), "twin-worker")
    open_streams.append(client.post("/v1/chat/completions", json=twin))  # twin's own queue has room
    assert [response.status_code for response in open_streams] == [200, 200]
    queues = redis.Redis.from_url(config.redis_url)
    assert [queues.llen(config.interactive_queue_of(model)) for model in ("tiny", "twin")] == [1, 1]


def test_queued_tokens_cap_counts_prompt_tokens(make_client) -> None:  # type: ignore[no-untyped-def]
    config, client = make_client(max_queued_requests=0, max_queued_tokens=1)
    open_stream = client.post("/v1/chat/completions", json=BODY)
    assert open_stream.status_code == 200
    assert client.post("/v1/chat/completions", json=BODY).status_code == 429
    assert num_requests(config) == 1


def test_a_keys_request_budget_is_a_429_with_openai_headers(make_client) -> None:  # type: ignore[no-untyped-def]
    config, client = make_client(rate_limit_rpm=2, rate_limit_tpm=10_000)
    first = client.post("/v1/chat/completions", json=BODY)
    assert first.status_code == 200
    assert first.headers["x-ratelimit-limit-requests"] == "2"
    assert first.headers["x-ratelimit-remaining-requests"] == "1"
    assert first.headers["x-ratelimit-limit-tokens"] == "10000"
    assert first.headers["x-ratelimit-reset-requests"].endswith("s")
    assert client.post("/v1/chat/completions", json=BODY).headers["x-ratelimit-remaining-requests"] == "0"
    refused = client.post("/v1/chat/completions", json=BODY)
    assert refused.status_code == 429 and 1 <= int(refused.headers["Retry-After"]) <= 60
    assert refused.get_json()["error"]["code"] == "rate_limit_exceeded"
    assert refused.headers["x-ratelimit-remaining-requests"] == "0"
    assert num_requests(config) == 2


def test_a_keys_token_budget_refuses_what_would_exceed_it(make_client) -> None:  # type: ignore[no-untyped-def]
    _, client = make_client(rate_limit_tpm=30)
    big = {**BODY, "max_tokens": 40}  # prompt + max_tokens is over 30 on its own
    refused = client.post("/v1/chat/completions", json=big)
    assert refused.status_code == 429 and "tokens" in refused.get_json()["error"]["message"]
    assert client.post("/v1/chat/completions", json=BODY).status_code == 200, "a refused request is not charged"
