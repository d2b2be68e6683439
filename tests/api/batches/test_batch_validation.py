"""The background validation of batch files in one api process: a line over MAX_REQUEST_BYTES is that line's error,
a small file is not kept waiting behind a large one, and an error while validating fails the batch at once."""

from __future__ import annotations

import io
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from flask.testing import FlaskClient

from api.app import create_app
from tasks.config import Config
from tasks.store.db import upgrade_to_head
from tests.api.batches.test_batches_no_worker import CHAT_URL, chat_line, validated
from tests.conftest import make_test_config

MAX_REQUEST_BYTES = 2048


@pytest.fixture
def api(tiny_model_dir: Path, redis_url: str, tmp_path: Path) -> Iterator[tuple[Config, FlaskClient]]:
    database_url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    upgrade_to_head(database_url)
    config = make_test_config(tiny_model_dir, redis_url, database_url, max_request_bytes=MAX_REQUEST_BYTES)
    yield config, create_app(config).test_client()
    client = redis.Redis.from_url(redis_url)
    client.delete(config.bulk_queue_of(config.model_name))
    for key in client.scan_iter(f"{config.redis_prefix}*"):
        client.delete(key)


def submit(client: FlaskClient, lines: list[str]) -> dict:
    data = {"purpose": "batch", "file": (io.BytesIO("\n".join(lines).encode()), "in.jsonl")}
    file_id = client.post("/v1/files", data=data, content_type="multipart/form-data").get_json()["id"]
    body = {"input_file_id": file_id, "endpoint": CHAT_URL, "completion_window": "24h"}
    reply = client.post("/v1/batches", json=body)
    # validation runs in the background: a two-line file may already be through it when the answer is written
    assert reply.status_code == 200 and reply.get_json()["status"] in ("validating", "in_progress"), reply.get_json()
    return reply.get_json()


def test_a_line_over_max_request_bytes_is_that_lines_error(api: tuple[Config, FlaskClient]) -> None:
    config, client = api
    long_line = chat_line("long", config.model_name, user="u" * MAX_REQUEST_BYTES)
    batch = validated(client, submit(client, [chat_line("ok", config.model_name), long_line]))
    assert batch["status"] == "in_progress" and batch["request_counts"]["failed"] == 1
    [error] = batch["errors"]["data"]
    assert (error["line"], error["code"]) == (2, "line_too_large")


def test_a_small_file_is_not_kept_waiting_behind_a_large_one(api: tuple[Config, FlaskClient]) -> None:
    config, client = api
    large = submit(client, [chat_line(f"l-{i}", config.model_name) for i in range(20 * 256)])
    small = validated(client, submit(client, [chat_line("s", config.model_name)]))
    assert small["status"] == "in_progress"
    assert client.get(f"/v1/batches/{large['id']}").get_json()["status"] == "validating"
    client.post(f"/v1/batches/{large['id']}/cancel")


def test_an_error_while_validating_fails_the_batch_at_once(
    api: tuple[Config, FlaskClient], monkeypatch: pytest.MonkeyPatch
) -> None:
    config, client = api

    def broken(*args: object) -> None:
        raise RuntimeError("validation broke")

    monkeypatch.setattr("api.batches.validation.parse_line", broken)
    started = time.monotonic()
    batch = validated(client, submit(client, [chat_line("a", config.model_name)]))
    assert time.monotonic() - started < 5
    assert batch["status"] == "failed" and batch["failed_at"] is not None
    assert batch["errors"]["data"][0]["code"] == "validation_failed"
