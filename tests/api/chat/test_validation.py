"""Bad input gets 400 (an unknown model 404) in OpenAI's error shape before anything is recorded or queued."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from flask.testing import FlaskClient
from sqlalchemy import func, select

from api.app import create_app
from tasks.config import Config
from tasks.store.db import make_db_engine, upgrade_to_head
from tasks.store.models import RequestRecord
from tests.conftest import make_test_config

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
GOOD_MESSAGES = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def config(tiny_model_dir: Path, redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Config:
    database_url = f"sqlite:///{tmp_path_factory.mktemp('validation') / 'db.sqlite'}"
    upgrade_to_head(database_url)
    return make_test_config(tiny_model_dir, redis_url, database_url)


@pytest.fixture(scope="module")
def client(config: Config) -> Iterator[FlaskClient]:
    yield create_app(config).test_client()


def chat(model: str, **fields: object) -> dict:
    return {"model": model, "messages": GOOD_MESSAGES, **fields}


CASES = [
    (CHAT, lambda m: {"messages": GOOD_MESSAGES}, "model", None),
    (CHAT, lambda m: {"model": m, "messages": []}, "messages", None),
    (CHAT, lambda m: {"model": m, "messages": [{"role": "wizard", "content": "x"}]}, "messages.0.role", None),
    (CHAT, lambda m: chat(m, temperature=2.5), "temperature", None),
    (CHAT, lambda m: chat(m, temperature=-1), "temperature", None),
    (CHAT, lambda m: chat(m, top_p=0), "top_p", None),
    (CHAT, lambda m: chat(m, top_p=1.5), "top_p", None),
    (CHAT, lambda m: chat(m, max_tokens=0), "max_tokens", None),
    (CHAT, lambda m: chat(m, max_tokens="ten"), "max_tokens", None),
    (CHAT, lambda m: chat(m, max_completion_tokens=-3), "max_completion_tokens", None),
    (CHAT, lambda m: chat(m, max_tokens=10**9), "max_tokens", "context_length_exceeded"),
    (CHAT, lambda m: chat(m, stop=[""]), "stop", None),
    (CHAT, lambda m: chat(m, stop=["x"] * 17), "stop", None),
    (CHAT, lambda m: chat(m, seed="abc"), "seed", None),
    (CHAT, lambda m: chat(m, n=0), "n", None),
    (CHAT, lambda m: chat(m, speculative={"method": "draft"}), "speculative.method", None),
    (CHAT, lambda m: chat(m, speculative={"method": "ngram", "num_tokens": 0}), "speculative.num_tokens", None),
    (CHAT, lambda m: chat(m, speculative={"method": "magic"}), "speculative.method", None),
    (CHAT, lambda m: chat(m, n=17), "n", None),
    (CHAT, lambda m: chat(m, presence_penalty=2.5), "presence_penalty", None),
    (CHAT, lambda m: chat(m, frequency_penalty=-3), "frequency_penalty", None),
    (CHAT, lambda m: chat(m, repetition_penalty=0), "repetition_penalty", None),
    (CHAT, lambda m: chat(m, top_k=-2), "top_k", None),
    (CHAT, lambda m: chat(m, min_p=1.5), "min_p", None),
    (CHAT, lambda m: chat(m, min_tokens=-1), "min_tokens", None),
    (CHAT, lambda m: chat(m, max_tokens=5, min_tokens=6), "min_tokens", None),
    (CHAT, lambda m: chat(m, stop_token_ids=[10**9]), "stop_token_ids", None),
    (CHAT, lambda m: chat(m, top_logprobs=3), "top_logprobs", None),
    (CHAT, lambda m: chat(m, logprobs=True, top_logprobs=21), "top_logprobs", None),
    (CHAT, lambda m: chat(m, stream_options={"include_usage": True}), "stream_options", None),
    (CHAT, lambda m: chat(m, return_token_ids=True), "return_token_ids", None),
    (CHAT, lambda m: chat(m, unknown_field=1), "unknown_field", None),
    (CHAT, lambda m: chat(m, messages=[{"role": "user", "content": "word " * 5000}]), "messages",
     "context_length_exceeded"),
    (COMPLETIONS, lambda m: {"model": m, "prompt": ""}, "prompt", None),
    (COMPLETIONS, lambda m: {"model": m, "prompt": ["a", ""]}, "prompt", None),
    (COMPLETIONS, lambda m: {"model": m, "prompt": [[1, 2], []]}, "prompt", None),
    (COMPLETIONS, lambda m: {"model": m, "prompt": ["a"] * 129}, "prompt", None),
    (COMPLETIONS, lambda m: {"model": m, "prompt": ["a"] * 10, "n": 16}, None, None),
    (COMPLETIONS, lambda m: {"model": m, "prompt": [[5], [10**9]]}, "prompt", None),
    (COMPLETIONS, lambda m: {"model": m, "prompt": ["hi", "word " * 5000], "max_tokens": 1}, "prompt",
     "context_length_exceeded"),
    (COMPLETIONS, lambda m: {"model": m, "prompt": "hi", "max_tokens": 0}, "max_tokens", None),
    (COMPLETIONS, lambda m: {"model": m, "prompt": "hi", "suffix": "!"}, "suffix", None),
    (COMPLETIONS, lambda m: {"model": m, "prompt": "hi", "prompt_logprobs": 21}, "prompt_logprobs", None),
    (COMPLETIONS, lambda m: {"model": m, "prompt": "hi", "logit_bias": {"5": 101}}, "logit_bias", None),
    (COMPLETIONS, lambda m: {"model": m, "prompt": "hi", "logit_bias": {"x": 1}}, "logit_bias", "invalid_value"),
    (CHAT, lambda m: chat(m, logit_bias={"-1": 1}), "logit_bias", "invalid_value"),
    (CHAT, lambda m: chat(m, logit_bias={"99999": 1}), "logit_bias", "invalid_value"),
    (CHAT, lambda m: chat(m, logit_bias={"5": -100.5}), "logit_bias", None),
    (COMPLETIONS, lambda m: {"model": m, "prompt": [10**9]}, "prompt", None),
    (COMPLETIONS, lambda m: {"model": m, "prompt": "hi", "logprobs": 21}, "logprobs", None),
    (COMPLETIONS, lambda m: {"model": m}, "prompt", None),
]  # fmt: skip


@pytest.mark.parametrize(("path", "make_body", "param", "code"), CASES)
def test_bad_input_is_refused_and_changes_nothing(
    client: FlaskClient, config: Config, path: str, make_body, param: str, code: str | None
) -> None:
    response = client.post(path, json=make_body(config.model_name))
    assert response.status_code == 400, response.get_data(as_text=True)
    error = response.get_json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error" and error["message"]
    assert error["param"] == param
    if code is not None:
        assert error["code"] == code
    assert_nothing_recorded_or_queued(config)


@pytest.mark.parametrize(
    ("path", "body"),
    [(CHAT, chat("no-such-model")), (COMPLETIONS, {"model": "no-such-model", "prompt": "hi"})],
)
def test_an_unknown_model_is_404_as_openai_answers(client: FlaskClient, config: Config, path: str, body: dict) -> None:
    response = client.post(path, json=body)
    assert response.status_code == 404
    error = response.get_json()["error"]
    assert (error["type"], error["param"], error["code"]) == ("invalid_request_error", "model", "model_not_found")
    assert f"`{config.model_name}`" in error["message"]  # it names what is served
    assert_nothing_recorded_or_queued(config)


@pytest.mark.parametrize("payload", [b"{not json", b"[1, 2]", b""])
def test_unparseable_body(client: FlaskClient, payload: bytes) -> None:
    response = client.post(CHAT, data=payload, content_type="application/json")
    assert response.status_code == 400
    assert response.get_json()["error"]["code"] == "invalid_json"


def test_unknown_route_and_method_are_openai_shaped(client: FlaskClient) -> None:
    assert client.get("/v1/nothing").get_json()["error"]["type"] == "invalid_request_error"
    response = client.get(CHAT)
    assert response.status_code == 405 and "error" in response.get_json()


def assert_nothing_recorded_or_queued(config: Config) -> None:
    engine = make_db_engine(config.database_url)
    with engine.connect() as connection:
        assert connection.execute(select(func.count()).select_from(RequestRecord)).scalar_one() == 0
    engine.dispose()
    assert redis.Redis.from_url(config.redis_url).llen(config.interactive_queue_of(config.model_name)) == 0
