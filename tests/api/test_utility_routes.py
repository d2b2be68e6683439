"""/tokenize, /detokenize, /version and the x-request-id header, on the api with SQLite (no worker needed)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from flask.testing import FlaskClient
from transformers import PreTrainedTokenizerFast

from api.app import create_app
from tasks.store.db import upgrade_to_head
from tests.conftest import make_test_config

MESSAGES = [{"role": "user", "content": "name a color"}, {"role": "assistant", "content": "The sky is"}]


@pytest.fixture
def client(tiny_model_dir: Path, redis_url: str, tmp_path: Path) -> Iterator[FlaskClient]:
    database_url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    upgrade_to_head(database_url)
    yield create_app(make_test_config(tiny_model_dir, redis_url, database_url)).test_client()


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path) -> PreTrainedTokenizerFast:
    return PreTrainedTokenizerFast.from_pretrained(tiny_model_dir)


def test_tokenize_and_detokenize_round_trip(client: FlaskClient, tokenizer: PreTrainedTokenizerFast) -> None:
    text = "the dog sat on the mat, naïve 🙂"
    reply = client.post("/tokenize", json={"model": "tiny", "prompt": text})
    assert reply.status_code == 200
    body = reply.get_json()
    assert body["tokens"] == tokenizer.encode(text) and body["count"] == len(body["tokens"])
    assert body["max_model_len"] == 4096 and body["token_strs"] is None
    plain = client.post("/tokenize", json={"prompt": text, "add_special_tokens": False, "return_token_strs": True})
    assert plain.get_json()["tokens"] == tokenizer.encode(text, add_special_tokens=False)
    assert plain.get_json()["token_strs"] == tokenizer.convert_ids_to_tokens(plain.get_json()["tokens"])
    back = client.post("/detokenize", json={"model": "tiny", "tokens": plain.get_json()["tokens"]})
    assert back.status_code == 200 and back.get_json() == {"prompt": text}


def test_tokenize_messages_as_chat_renders_them(client: FlaskClient, tokenizer: PreTrainedTokenizerFast) -> None:
    def rendered(**options: object) -> str:
        reply = client.post("/tokenize", json={"model": "tiny", "messages": MESSAGES, **options})
        assert reply.status_code == 200, reply.get_json()
        return tokenizer.decode(reply.get_json()["tokens"])

    opened = rendered()
    assert opened == tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False)
    assert opened.endswith("<|start_header_id|>assistant<|end_header_id|>\n\n")
    closed = rendered(add_generation_prompt=False)
    assert closed.endswith("The sky is<|eot_id|>")
    continued = rendered(add_generation_prompt=False, continue_final_message=True)
    assert continued.endswith("<|start_header_id|>assistant<|end_header_id|>\n\nThe sky is")


def test_tokenize_and_detokenize_refuse_bad_input(client: FlaskClient) -> None:
    both = client.post("/tokenize", json={"messages": MESSAGES, "continue_final_message": True})
    assert both.status_code == 400 and "add_generation_prompt" in both.get_json()["error"]["message"]
    unknown = client.post("/tokenize", json={"prompt": "x", "temperature": 1})
    assert unknown.status_code == 400 and unknown.get_json()["error"]["param"] == "temperature"
    wrong_model = client.post("/tokenize", json={"model": "other", "prompt": "x"})
    assert wrong_model.status_code in (400, 404) and wrong_model.get_json()["error"]["param"] == "model"
    out_of_range = client.post("/detokenize", json={"tokens": [0, 10**9]})
    assert out_of_range.status_code == 400 and out_of_range.get_json()["error"]["param"] == "tokens"


def test_version_is_the_package_version(client: FlaskClient) -> None:
    from importlib.metadata import version

    reply = client.get("/version")
    assert reply.status_code == 200 and reply.get_json() == {"version": version("steerbatch")}


def test_every_response_carries_a_request_id(client: FlaskClient) -> None:
    echoed = client.get("/version", headers={"X-Request-Id": "trace-123_abc"})
    assert echoed.headers["x-request-id"] == "trace-123_abc"
    fresh = {client.get("/version").headers["x-request-id"] for _ in range(2)}
    assert len(fresh) == 2 and all(value.startswith("req_") for value in fresh)
    for insane in ("a" * 129, "two words", "ctl\x01"):
        replaced = client.get("/version", headers={"X-Request-Id": insane}).headers["x-request-id"]
        assert replaced != insane and replaced.startswith("req_")
    error = client.post("/tokenize", json={"prompt": 1}, headers={"X-Request-Id": "on-an-error"})
    assert error.status_code == 400 and error.headers["x-request-id"] == "on-an-error"
    missing = client.get("/no/such/route")
    assert missing.status_code == 404 and missing.headers["x-request-id"].startswith("req_")
