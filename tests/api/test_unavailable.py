"""Redis or the database down: 503 in OpenAI's shape, never a traceback."""

from __future__ import annotations

from pathlib import Path

from api.app import create_app
from tasks.store.db import upgrade_to_head
from tests.conftest import free_port, make_test_config

BODY = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


def assert_503(response) -> None:  # type: ignore[no-untyped-def]
    assert response.status_code == 503, response.get_data(as_text=True)
    error = response.get_json()["error"]
    assert error["type"] == "service_unavailable" and "Traceback" not in error["message"]


def test_redis_down_gives_503(tiny_model_dir: Path, tmp_path: Path) -> None:
    database_url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    upgrade_to_head(database_url)
    config = make_test_config(tiny_model_dir, f"redis://127.0.0.1:{free_port()}/0", database_url)
    client = create_app(config).test_client()
    assert_503(client.post("/v1/chat/completions", json={**BODY, "model": config.model_name}))
    assert_503(client.get("/health"))


def test_database_down_gives_503(tiny_model_dir: Path, redis_url: str) -> None:
    database_url = f"postgresql+psycopg://postgres@127.0.0.1:{free_port()}/nothing"
    config = make_test_config(tiny_model_dir, redis_url, database_url)
    client = create_app(config).test_client()
    assert_503(client.post("/v1/chat/completions", json={**BODY, "model": config.model_name}))
    assert_503(client.get("/v1/requests/chatcmpl-x"))
