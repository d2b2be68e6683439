"""Chat and completions over real HTTP, through Redis and a real Celery worker, on SQLite and PostgreSQL."""

from __future__ import annotations

import pytest
import requests

from scripts.stack import Stack
from tests.service.http import auth
from tests.service.sse import data_frames, read_frames

pytestmark = pytest.mark.postgres  # on both databases: each request's row and result are written and read in SQL

USER_TURN = [{"role": "user", "content": "what is 3 plus 4?"}]


def post(stack: Stack, path: str, body: dict, **kwargs: object) -> requests.Response:
    return requests.post(f"{stack.base_url}{path}", json=body, headers=auth(stack), timeout=120, **kwargs)  # type: ignore[arg-type]


def test_chat_completion_has_openai_shape_and_is_recorded(stack: Stack) -> None:
    model = stack.config.model_name
    response = post(stack, "/v1/chat/completions", {"model": model, "messages": USER_TURN, "max_tokens": 12})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-") and body["model"] == model
    choice = body["choices"][0]
    assert choice["message"]["role"] == "assistant" and isinstance(choice["message"]["content"], str)
    assert choice["finish_reason"] in ("stop", "length")
    usage = body["usage"]
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert 1 <= usage["completion_tokens"] <= 12
    stored = requests.get(f"{stack.base_url}/v1/requests/{body['id']}", headers=auth(stack), timeout=10).json()
    assert stored["status"] == "completed" and stored["response"] == body


def test_max_tokens_is_honoured_and_reports_length(stack: Stack) -> None:
    body = {"model": stack.config.model_name, "prompt": "the cat", "max_tokens": 1, "temperature": 0}
    reply = post(stack, "/v1/completions", body).json()
    assert reply["object"] == "text_completion" and reply["id"].startswith("cmpl-")
    assert reply["usage"]["completion_tokens"] == 1
    assert reply["choices"][0]["finish_reason"] == "length"


def test_stop_string_truncates_text(stack: Stack) -> None:
    messages = [{"role": "user", "content": "tell me about cats"}]
    base = {"model": stack.config.model_name, "messages": messages, "max_tokens": 24, "temperature": 0}
    full = post(stack, "/v1/chat/completions", base).json()["choices"][0]["message"]["content"]
    assert len(full) > 4, full
    stop = full[2:4]
    cut = post(stack, "/v1/chat/completions", {**base, "stop": [stop, "never appears"]}).json()["choices"][0]
    assert cut["finish_reason"] == "stop"
    assert cut["message"]["content"] == full[: full.index(stop)]


def test_streamed_chat_ends_with_done_and_usage(stack: Stack) -> None:
    body = {
        "model": stack.config.model_name,
        "messages": USER_TURN,
        "max_tokens": 16,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    with post(stack, "/v1/chat/completions", body, stream=True) as response:
        assert response.status_code == 200
        assert response.headers["Content-Type"].startswith("text/event-stream")
        frames = data_frames(list(read_frames(response)))
    assert frames[-1].data == "[DONE]"
    chunks = [frame.json for frame in frames[:-1]]
    assert all(frame.event_id for frame in frames[:-3]) and frames[-1].event_id  # finish+usage ride on [DONE]'s id
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert chunks[-2]["choices"][0]["finish_reason"] in ("stop", "length")
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] >= 1
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    stored = requests.get(f"{stack.base_url}/v1/requests/{chunks[0]['id']}", headers=auth(stack), timeout=10).json()
    assert stored["response"]["choices"][0]["message"]["content"] == text


def test_concurrent_greedy_requests_get_identical_text(stack: Stack) -> None:
    from concurrent.futures import ThreadPoolExecutor

    body = {"model": stack.config.model_name, "prompt": "one two", "max_tokens": 8, "temperature": 0}
    with ThreadPoolExecutor(8) as pool:
        replies = list(pool.map(lambda _: post(stack, "/v1/completions", body).json(), range(8)))
    texts = {reply["choices"][0]["text"] for reply in replies}
    assert len(texts) == 1, "greedy decoding of one prompt must not depend on what else is in the batch"


def test_models_lists_the_served_model(stack: Stack) -> None:
    models = requests.get(f"{stack.base_url}/v1/models", headers=auth(stack), timeout=10).json()
    assert models["object"] == "list"
    assert [m["id"] for m in models["data"]] == [stack.config.model_name]
