"""A steering vector the service cannot use is the client's error naming the vector's field, `param`
`steering.vectors.<n>.path`: a path that cannot be inside the vector root is a 400 from the api before anything is
queued; a file that does not exist (only the worker can look) ends the request with the same `param`, as a 400 when
not streamed, as the stream's error event when streamed, and in a batch line's error object (`status_code` 400)."""

from __future__ import annotations

import json

import pytest
import requests

from scripts.stack import Stack
from tests.service.batch_helpers import chat_line, read_jsonl, submit, wait_for_end
from tests.service.http import auth
from tests.service.sse import data_frames, read_frames

MISSING = "no/such/vector.safetensors"


def steering(hidden_size: int, path: str) -> dict:
    """A valid inline vector first, so the bad one is the second: its `param` must name index 1."""
    return {"vectors": [{"layer": 0, "values": [0.0] * hidden_size}, {"layer": 1, "path": path}]}


@pytest.fixture(scope="module")
def hidden_size(stack: Stack) -> int:
    with open(f"{stack.config.model}/config.json") as config:
        return int(json.load(config)["hidden_size"])


def chat_body(stack: Stack, hidden_size: int, path: str, **fields: object) -> dict:
    messages = [{"role": "user", "content": "Name a color."}]
    return {"model": stack.config.model_name, "messages": messages, "max_tokens": 4,
            "steering": steering(hidden_size, path), **fields}  # fmt: skip


def post_chat(stack: Stack, body: dict, **options: object) -> requests.Response:
    url = f"{stack.base_url}/v1/chat/completions"
    return requests.post(url, json=body, headers=auth(stack), timeout=60, **options)  # type: ignore[arg-type]


def assert_names_the_path(error: dict, path: str) -> None:
    assert error["type"] == "invalid_request_error", error
    assert error["param"] == "steering.vectors.1.path", error
    assert path in error["message"], error


@pytest.mark.parametrize("path", [MISSING, "/etc/passwd", "../x.safetensors"])
def test_a_vector_file_that_is_missing_or_refused_is_a_400_naming_its_path(
    stack: Stack, hidden_size: int, path: str
) -> None:
    reply = post_chat(stack, chat_body(stack, hidden_size, path))
    assert reply.status_code == 400, reply.text
    assert_names_the_path(reply.json()["error"], path)


def test_a_streamed_request_with_a_missing_vector_file_ends_with_its_error_event(
    stack: Stack, hidden_size: int
) -> None:
    with post_chat(stack, chat_body(stack, hidden_size, MISSING, stream=True), stream=True) as reply:
        assert reply.status_code == 200
        frames = data_frames(list(read_frames(reply)))
    assert frames[-1].data == "[DONE]"
    errors = [frame.json["error"] for frame in frames[:-1] if "error" in frame.json]
    assert len(errors) == 1, frames
    assert_names_the_path(errors[0], MISSING)


def test_a_batch_line_with_a_missing_vector_file_is_its_own_400_naming_its_path(stack: Stack, hidden_size: int) -> None:
    lines = [
        chat_line(stack, "missing", steering=steering(hidden_size, MISSING)),
        chat_line(stack, "plain"),
    ]
    batch = wait_for_end(stack, submit(stack, lines))
    assert batch.status == "completed" and batch.request_counts.completed == 1 and batch.request_counts.failed == 1
    [failed] = read_jsonl(stack, batch.error_file_id)
    assert failed["custom_id"] == "missing" and failed["response"]["status_code"] == 400, failed
    assert_names_the_path(failed["response"]["body"]["error"], MISSING)
    [done] = read_jsonl(stack, batch.output_file_id)
    assert done["custom_id"] == "plain" and done["response"]["status_code"] == 200
