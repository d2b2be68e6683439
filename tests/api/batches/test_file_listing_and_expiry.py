"""GET /v1/files pages a tenant's files as OpenAI does; `expires_after` sets a file's `expires_at`, an expired file is
gone at once and the batch reaper's pass deletes it (row and bytes). On the api with SQLite."""

from __future__ import annotations

import io
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from flask.testing import FlaskClient
from sqlalchemy import update

from api.app import create_app
from tasks.batches.models import FileRecord
from tasks.config import Config
from tasks.reapers.batch_reaper import reap_once
from tasks.store.db import make_db_engine, make_session_factory, upgrade_to_head
from tests.conftest import make_test_config


@pytest.fixture
def api(tiny_model_dir: Path, redis_url: str, tmp_path: Path) -> Iterator[tuple[Config, FlaskClient]]:
    database_url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    upgrade_to_head(database_url)
    config = make_test_config(tiny_model_dir, redis_url, database_url)
    yield config, create_app(config).test_client()


def upload(client: FlaskClient, name: str, **form: str):  # type: ignore[no-untyped-def]
    data = {"purpose": "batch", "file": (io.BytesIO(b"{}\n"), name), **form}
    return client.post("/v1/files", data=data, content_type="multipart/form-data")


def test_files_list_pages_in_either_order(api: tuple[Config, FlaskClient]) -> None:
    _, client = api
    ids = [upload(client, f"f{i}.jsonl").get_json()["id"] for i in range(5)]
    everything = client.get("/v1/files").get_json()
    assert everything["object"] == "list" and everything["has_more"] is False
    newest_first = [file["id"] for file in everything["data"]]
    assert newest_first == ids[::-1] and everything["first_id"] == ids[-1]  # ids sort by creation time

    def walk(order: str) -> list[str]:
        seen, after = [], None
        while True:
            query = {"limit": 2, "order": order, **({"after": after} if after else {})}
            page = client.get("/v1/files", query_string=query).get_json()
            seen += [file["id"] for file in page["data"]]
            assert page["last_id"] == (page["data"][-1]["id"] if page["data"] else None)
            if not page["has_more"]:
                return seen
            after = page["last_id"]

    assert walk("desc") == newest_first
    assert walk("asc") == newest_first[::-1]
    assert client.get("/v1/files", query_string={"purpose": "batch_output"}).get_json()["data"] == []
    for limit in (0, "null", "2.0"):  # not an integer in range: refused, not the default page
        assert client.get("/v1/files", query_string={"limit": limit}).get_json()["error"]["param"] == "limit"
    assert client.get("/v1/files", query_string={"order": "up"}).get_json()["error"]["param"] == "order"


def test_expires_after_is_stored_and_bounded(api: tuple[Config, FlaskClient]) -> None:
    _, client = api
    policy = {"expires_after[anchor]": "created_at", "expires_after[seconds]": "3600"}
    created = upload(client, "a.jsonl", **policy).get_json()
    assert created["expires_at"] == created["created_at"] + 3600
    assert client.get(f"/v1/files/{created['id']}").get_json()["expires_at"] == created["expires_at"]
    assert upload(client, "b.jsonl").get_json()["expires_at"] is None
    short = upload(client, "c.jsonl", **{**policy, "expires_after[seconds]": "60"})
    assert short.status_code == 400 and short.get_json()["error"]["param"] == "expires_after.seconds"
    anchor = upload(client, "d.jsonl", **{**policy, "expires_after[anchor]": "last_active_at"})
    assert anchor.status_code == 400 and anchor.get_json()["error"]["param"] == "expires_after.anchor"


def test_an_expired_file_is_gone_and_the_reaper_deletes_it(api: tuple[Config, FlaskClient]) -> None:
    config, client = api
    policy = {"expires_after[anchor]": "created_at", "expires_after[seconds]": "3600"}
    expiring, kept = (upload(client, name, **policy).get_json()["id"] for name in ("x.jsonl", "y.jsonl"))
    sessions = make_session_factory(make_db_engine(config.database_url))
    with sessions() as session:
        session.execute(update(FileRecord).where(FileRecord.id == expiring).values(expires_at=int(time.time()) - 1))
        session.commit()
    assert client.get(f"/v1/files/{expiring}").status_code == 404
    assert [file["id"] for file in client.get("/v1/files").get_json()["data"]] == [kept]
    reap_once(sessions, redis.Redis.from_url(config.redis_url), config, enqueue=lambda chunk: None)
    with sessions() as session:
        assert session.get(FileRecord, expiring) is None and session.get(FileRecord, kept) is not None


def test_a_batch_output_expires_after_what_the_batch_asked(api: tuple[Config, FlaskClient]) -> None:
    _, client = api
    input_id = upload(client, "in.jsonl").get_json()["id"]  # one line, `{}`: invalid, so the batch fails at once
    body = {"input_file_id": input_id, "endpoint": "/v1/chat/completions", "completion_window": "24h"}
    too_short = client.post(
        "/v1/batches", json={**body, "output_expires_after": {"anchor": "created_at", "seconds": 5}}
    )
    assert too_short.status_code == 400 and too_short.get_json()["error"]["param"] == "output_expires_after.seconds"
    policy = {"anchor": "created_at", "seconds": 7200}
    batch = client.post("/v1/batches", json={**body, "output_expires_after": policy}).get_json()
    deadline = time.monotonic() + 30
    while batch["status"] == "validating" and time.monotonic() < deadline:
        time.sleep(0.05)
        batch = client.get(f"/v1/batches/{batch['id']}").get_json()
    assert batch["status"] == "failed"
    error_file = client.get(f"/v1/files/{batch['error_file_id']}").get_json()
    assert error_file["expires_at"] == error_file["created_at"] + 7200
