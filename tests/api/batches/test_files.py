"""Files: upload, read back, delete, the size cap (413) and Idempotency-Key, on the api with SQLite."""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path

import pytest
from flask.testing import FlaskClient

from api.app import create_app
from tasks.store.db import upgrade_to_head
from tests.conftest import make_test_config

MAX_FILE_BYTES = 4096


@pytest.fixture
def client(tiny_model_dir: Path, redis_url: str, tmp_path: Path) -> Iterator[FlaskClient]:
    database_url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    upgrade_to_head(database_url)
    config = make_test_config(tiny_model_dir, redis_url, database_url, max_file_bytes=MAX_FILE_BYTES)
    yield create_app(config).test_client()


def upload(client: FlaskClient, content: bytes, purpose: str = "batch", key: str | None = None):  # type: ignore[no-untyped-def]
    headers = {"Idempotency-Key": key} if key else {}
    data = {"purpose": purpose, "file": (io.BytesIO(content), "prompts.jsonl")}
    return client.post("/v1/files", data=data, content_type="multipart/form-data", headers=headers)


def test_upload_read_and_delete(client: FlaskClient) -> None:
    reply = upload(client, b'{"a": 1}\n')
    assert reply.status_code == 200
    created = reply.get_json()
    assert created["object"] == "file" and created["bytes"] == 9 and created["filename"] == "prompts.jsonl"
    assert client.get(f"/v1/files/{created['id']}").get_json() == created
    assert client.get(f"/v1/files/{created['id']}/content").data == b'{"a": 1}\n'
    assert client.delete(f"/v1/files/{created['id']}").get_json() == {
        "id": created["id"],
        "object": "file",
        "deleted": True,
    }
    missing = client.get(f"/v1/files/{created['id']}")
    assert missing.status_code == 404 and missing.get_json()["error"]["code"] == "not_found"


def test_a_file_over_the_cap_is_refused_with_413(client: FlaskClient) -> None:
    assert upload(client, b"x" * MAX_FILE_BYTES).status_code == 200
    too_big = upload(client, b"x" * (MAX_FILE_BYTES + 1))
    assert too_big.status_code == 413 and too_big.get_json()["error"]["code"] == "file_too_large"
    far_too_big = upload(client, b"x" * (MAX_FILE_BYTES + 200_000))
    assert far_too_big.status_code == 413 and "error" in far_too_big.get_json()


def test_only_the_batch_purpose_and_a_file_field_are_accepted(client: FlaskClient) -> None:
    assert upload(client, b"{}", purpose="fine-tune").get_json()["error"]["param"] == "purpose"
    no_file = client.post("/v1/files", data={"purpose": "batch"}, content_type="multipart/form-data")
    assert no_file.status_code == 400 and no_file.get_json()["error"]["param"] == "file"


def test_idempotency_key_replays_the_same_upload_and_refuses_another(client: FlaskClient) -> None:
    first = upload(client, b'{"a": 1}\n', key="upload-1").get_json()
    assert upload(client, b'{"a": 1}\n', key="upload-1").get_json() == first
    conflict = upload(client, b'{"a": 2}\n', key="upload-1")
    assert conflict.status_code == 409 and conflict.get_json()["error"]["code"] == "idempotency_key_reused"
    assert upload(client, b'{"a": 1}\n', key="upload-2").get_json()["id"] != first["id"]


def test_an_idempotency_key_gunicorn_would_refuse_is_refused_here_too(client: FlaskClient) -> None:
    """gunicorn answers a NUL in a header itself; under any other server the api refuses it before SQL sees it."""
    reply = upload(client, b"{}", key="key\x00")
    assert reply.status_code == 400 and reply.get_json()["error"]["param"] == "Idempotency-Key"
