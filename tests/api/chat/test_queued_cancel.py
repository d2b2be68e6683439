"""A request no worker has taken still ends in exactly one result when it times out or is cancelled."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
import redis
from flask.testing import FlaskClient

from api.app import create_app
from tasks.config import Config
from tasks.messages.generation import EventType, FinishReason, StreamEvent
from tasks.store.db import upgrade_to_head
from tasks.streams.redis_keys import RedisKeys
from tasks.streams.worker_leases import renew_worker_lease
from tests.conftest import make_test_config

BODY = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


@pytest.fixture
def no_worker(tiny_model_dir: Path, redis_url: str, tmp_path: Path) -> tuple[Config, FlaskClient]:
    """The api with its queue and a live worker that consumes nothing (busy, say)."""
    database_url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    upgrade_to_head(database_url)
    config = make_test_config(tiny_model_dir, redis_url, database_url, request_timeout_s=1.0, sse_heartbeat_s=0.2)
    renew_worker_lease(redis.Redis.from_url(redis_url), config, "busy-worker")
    yield config, create_app(config).test_client()
    client = redis.Redis.from_url(redis_url)
    client.delete(config.interactive_queue_of(config.model_name))
    for key in client.scan_iter(f"{config.redis_prefix}*"):
        client.delete(key)


def final_event(config: Config, request_id: str) -> StreamEvent:
    client = redis.Redis.from_url(config.redis_url, decode_responses=True)
    entries = client.xrange(RedisKeys(config.redis_prefix).request_stream(request_id))
    events = [StreamEvent.from_dict(json.loads(fields["event"])) for _, fields in entries]
    assert [event.type for event in events] == [EventType.FINAL]
    return events[0]


def test_timeout_of_a_queued_request_cancels_it(no_worker: tuple[Config, FlaskClient]) -> None:
    config, client = no_worker
    response = client.post("/v1/chat/completions", json={**BODY, "model": config.model_name})
    assert response.status_code == 504 and response.get_json()["error"]["code"] == "timeout"
    request_id = _only_request_id(config)
    record = client.get(f"/v1/requests/{request_id}").get_json()
    assert record["status"] == "cancelled" and record["response"]["choices"][0]["finish_reason"] == "abort"
    assert final_event(config, request_id).finish_reason == FinishReason.ABORT


def test_stream_of_a_queued_request_times_out_with_an_error_frame(no_worker: tuple[Config, FlaskClient]) -> None:
    config, client = no_worker
    body = {**BODY, "model": config.model_name, "stream": True}
    text = client.post("/v1/chat/completions", json=body).get_data(as_text=True)
    assert ": keep-alive" in text and '"code": "timeout"' in text
    record = client.get("/v1/requests/" + _only_request_id(config)).get_json()
    assert record["status"] == "cancelled"


def test_cancel_of_a_queued_request_ends_it_at_once(no_worker: tuple[Config, FlaskClient]) -> None:
    config, client = no_worker
    stream = client.post("/v1/chat/completions", json={**BODY, "model": config.model_name, "stream": True})
    request_id = _only_request_id(config)
    cancelled = client.post(f"/v1/requests/{request_id}/cancel").get_json()
    assert cancelled["status"] == "cancelled"
    text = stream.get_data(as_text=True)
    assert '"finish_reason": "abort"' in text and text.rstrip().endswith("data: [DONE]")


def _only_request_id(config: Config) -> str:
    """The id in the one task the api queued (Celery's JSON message, its body base64-encoded)."""
    client = redis.Redis.from_url(config.redis_url, decode_responses=True)
    messages = client.lrange(config.interactive_queue_of(config.model_name), 0, -1)
    assert len(messages) == 1
    args, _kwargs, _embed = json.loads(base64.b64decode(json.loads(messages[0])["body"]))
    return args[0]["request_id"]
