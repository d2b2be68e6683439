"""The Batch API before any worker runs a line: validation (in the background) with line numbers, dispatch onto the
bulk queue, idempotency, listing, and cancel (which closes a batch none of whose lines had started)."""

from __future__ import annotations

import io
import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from flask.testing import FlaskClient

from api.app import create_app
from tasks.config import Config
from tasks.store.db import upgrade_to_head
from tests.conftest import make_test_config

CHAT_URL = "/v1/chat/completions"


@pytest.fixture
def api(tiny_model_dir: Path, redis_url: str, tmp_path: Path) -> Iterator[tuple[Config, FlaskClient]]:
    database_url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    upgrade_to_head(database_url)
    config = make_test_config(
        tiny_model_dir, redis_url, database_url, batch_chunk_size=2, batch_chunks_in_flight=3, sse_heartbeat_s=0.2
    )
    yield config, create_app(config).test_client()
    client = redis.Redis.from_url(redis_url)
    client.delete(config.bulk_queue_of(config.model_name))
    for key in client.scan_iter(f"{config.redis_prefix}*"):
        client.delete(key)


def chat_line(custom_id: str, model: str, **body: object) -> str:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, **body}
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": CHAT_URL, "body": body})


def create_batch(client: FlaskClient, lines: list[str], key: str | None = None) -> dict:
    data = {"purpose": "batch", "file": (io.BytesIO("\n".join(lines).encode()), "in.jsonl")}
    file_id = client.post("/v1/files", data=data, content_type="multipart/form-data").get_json()["id"]
    headers = {"Idempotency-Key": key} if key else {}
    body = {"input_file_id": file_id, "endpoint": CHAT_URL, "completion_window": "24h", "metadata": {"run": "t"}}
    reply = client.post("/v1/batches", json=body, headers=headers)
    assert reply.status_code == 200, reply.get_json()
    return validated(client, reply.get_json())


def validated(client: FlaskClient, batch: dict, timeout_s: float = 30.0) -> dict:
    """The batch once its background validation is over."""
    deadline = time.monotonic() + timeout_s
    while batch["status"] == "validating":
        assert time.monotonic() < deadline, f"batch {batch['id']} is still validating"
        time.sleep(0.02)
        batch = client.get(f"/v1/batches/{batch['id']}").get_json()
    return batch


def chunks_enqueued(config: Config, expected: int, timeout_s: float = 2.0) -> int:
    """Chunks on the bulk queue once `expected` are there or `timeout_s` passed: the validator dispatches them just
    after the batch shows in_progress."""
    client = redis.Redis.from_url(config.redis_url)
    deadline = time.monotonic() + timeout_s
    while client.llen(config.bulk_queue_of(config.model_name)) < expected and time.monotonic() < deadline:
        time.sleep(0.02)
    return client.llen(config.bulk_queue_of(config.model_name))


def test_invalid_lines_are_reported_with_their_line_numbers(api: tuple[Config, FlaskClient]) -> None:
    config, client = api
    model = config.model_name
    lines = [
        chat_line("ok-1", model),
        "{not json",
        json.dumps({"custom_id": "url", "method": "POST", "url": "/v1/embeddings", "body": {}}),
        chat_line("bad-temperature", model, temperature=5),
        chat_line("ok-1", model),
        chat_line("streamed", model, stream=True),
        chat_line("other-model", "gpt-4o"),
        "",
        chat_line("too-long", model, max_tokens=10**6),
        chat_line("ok-2", model),
        chat_line("two-choices", model, n=2),
        chat_line("too-many-choices", model, n=17),
    ]
    batch = create_batch(client, lines)
    assert batch["status"] == "in_progress" and batch["request_counts"] == {"total": 11, "completed": 0, "failed": 8}
    errors = {error["line"]: error for error in batch["errors"]["data"]}
    assert sorted(errors) == [2, 3, 4, 5, 6, 7, 9, 12]
    assert errors[2]["code"] == "invalid_json" and errors[3]["code"] == "invalid_url"
    assert errors[4]["param"] == "temperature" and errors[5]["code"] == "duplicate_custom_id"
    assert errors[6]["param"] == "stream" and errors[7]["code"] == "model_not_found"
    assert errors[9]["code"] == "context_length_exceeded"
    assert errors[12]["param"] == "n"
    assert chunks_enqueued(config, 2) == 2, "three valid lines make a chunk of two and a chunk of one"


def test_a_batch_with_no_valid_line_fails_with_an_error_file(api: tuple[Config, FlaskClient]) -> None:
    config, client = api
    batch = create_batch(client, ["[1, 2]", chat_line("x", config.model_name, top_p=0)])
    assert batch["status"] == "failed" and batch["failed_at"] is not None and batch["output_file_id"] is None
    assert batch["request_counts"] == {"total": 2, "completed": 0, "failed": 2}
    error_lines = [
        json.loads(line) for line in client.get(f"/v1/files/{batch['error_file_id']}/content").data.splitlines()
    ]
    assert [(line["custom_id"], line["error"]["line"]) for line in error_lines] == [(None, 1), ("x", 2)]
    assert redis.Redis.from_url(config.redis_url).llen(config.bulk_queue_of(config.model_name)) == 0


def test_dispatch_keeps_only_the_window_of_chunks_on_the_queue(api: tuple[Config, FlaskClient]) -> None:
    config, client = api
    batch = create_batch(client, [chat_line(f"line-{i}", config.model_name) for i in range(20)])
    assert batch["request_counts"] == {"total": 20, "completed": 0, "failed": 0}
    assert chunks_enqueued(config, config.batch_chunks_in_flight) == config.batch_chunks_in_flight


def test_cancel_before_any_line_ran_closes_the_batch(api: tuple[Config, FlaskClient]) -> None:
    config, client = api
    batch = create_batch(client, [chat_line(f"line-{i}", config.model_name) for i in range(5)] + ["oops"])
    cancelled = client.post(f"/v1/batches/{batch['id']}/cancel").get_json()
    assert cancelled["status"] == "cancelled" and cancelled["cancelling_at"] and cancelled["cancelled_at"]
    assert cancelled["request_counts"] == {"total": 6, "completed": 0, "failed": 6}
    errors = [
        json.loads(line) for line in client.get(f"/v1/files/{cancelled['error_file_id']}/content").data.splitlines()
    ]
    assert [line["error"]["code"] for line in errors] == ["batch_cancelled"] * 5 + ["invalid_json"]
    again = client.post(f"/v1/batches/{batch['id']}/cancel").get_json()
    assert again["status"] == "cancelled"
    events = client.get(f"/v1/batches/{batch['id']}/events").get_data(as_text=True)
    statuses = [json.loads(line[6:])["status"] for line in events.splitlines() if line.startswith("data: {")]
    assert statuses == ["in_progress", "cancelling", "cancelled"] and events.rstrip().endswith("data: [DONE]")


def test_idempotency_key_replays_the_batch_and_refuses_another_body(api: tuple[Config, FlaskClient]) -> None:
    config, client = api
    first = create_batch(client, [chat_line("a", config.model_name)], key="batch-1")
    body = {
        "input_file_id": first["input_file_id"],
        "endpoint": CHAT_URL,
        "completion_window": "24h",
        "metadata": {"run": "t"},
    }
    replay = client.post("/v1/batches", json=body, headers={"Idempotency-Key": "batch-1"})
    assert replay.get_json()["id"] == first["id"]
    conflict = client.post(
        "/v1/batches", json={**body, "metadata": {"run": "u"}}, headers={"Idempotency-Key": "batch-1"}
    )
    assert conflict.status_code == 409 and conflict.get_json()["error"]["code"] == "idempotency_key_reused"


def test_list_pages_newest_first(api: tuple[Config, FlaskClient]) -> None:
    config, client = api
    ids = [create_batch(client, [chat_line("a", config.model_name)])["id"] for _ in range(3)]
    page = client.get("/v1/batches?limit=2").get_json()
    assert [b["id"] for b in page["data"]] == ids[::-1][:2] and page["has_more"] is True
    rest = client.get(f"/v1/batches?limit=2&after={page['last_id']}").get_json()
    assert [b["id"] for b in rest["data"]] == [ids[0]] and rest["has_more"] is False


def test_bad_create_requests_are_refused(api: tuple[Config, FlaskClient]) -> None:
    _, client = api
    base = {"input_file_id": "file-missing", "endpoint": CHAT_URL, "completion_window": "24h"}
    assert client.post("/v1/batches", json=base).status_code == 404
    assert (
        client.post("/v1/batches", json={**base, "endpoint": "/v1/moderations"}).get_json()["error"]["param"]
        == "endpoint"
    )
    assert client.post("/v1/batches", json={**base, "completion_window": "1h"}).status_code == 400
    assert client.get("/v1/batches/batch_nope").status_code == 404


def test_an_empty_file_fails_the_batch(api: tuple[Config, FlaskClient]) -> None:
    _, client = api
    batch = create_batch(client, ["", "  "])
    assert batch["status"] == "failed" and batch["errors"]["data"][0]["code"] == "empty_file"
    assert batch["request_counts"] == {"total": 0, "completed": 0, "failed": 0}
