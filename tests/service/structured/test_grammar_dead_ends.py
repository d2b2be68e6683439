"""A grammar that the api's check accepts (its first token can be written) but that dead-ends mid-generation (a rule
with no base case after a literal, a required property whose `$ref` refers only to itself): only the worker can tell,
when the grammar allows no token at all. That request ends alone with an `invalid_request_error` naming its field (a
400 when not streamed, the stream's error event when streamed), never the engine's `server_error`; the requests
running beside it in the same engine steps finish as they would have alone."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from scripts.stack import Stack
from tests.service.http import auth
from tests.service.sse import data_frames, read_frames

# Required "a" is a definition whose only branch is itself: `{"a": ` is written, then nothing. (A bare `$ref` to
# itself is no dead end from xgrammar 0.2.9 on: it refuses that chain when it compiles.)
LOOPING_PROPERTY = {
    "type": "object",
    "properties": {"a": {"$ref": "#/$defs/x"}},
    "required": ["a"],
    "$defs": {"x": {"anyOf": [{"$ref": "#/$defs/x"}]}},
}
DEAD_ENDS = [  # (body fields, the param named): each lets the model write a first token, then allows none
    ({"guided_grammar": 'root ::= "a" b\nb ::= b "x"'}, "guided_grammar"),
    (
        {
            "response_format": {
                "type": "json_schema",
                "json_schema": {
                    "name": "looping",
                    "schema": LOOPING_PROPERTY,
                },
            }
        },
        "response_format.json_schema.schema",
    ),
]
PLAIN = {"max_tokens": 48, "ignore_eos": True, "temperature": 0}


def chat(stack: Stack, content: str, **fields: object) -> requests.Response:
    body = {"model": stack.config.model_name, "messages": [{"role": "user", "content": content}], **fields}
    return requests.post(f"{stack.base_url}/v1/chat/completions", json=body, headers=auth(stack), timeout=120)


def assert_refused_by_the_worker(error: dict, param: str) -> None:
    assert error["type"] == "invalid_request_error", error
    assert error["param"] == param, error
    assert "grammar" in error["message"] and "allows no token" in error["message"], error


@pytest.mark.parametrize(("fields", "param"), DEAD_ENDS)
def test_a_grammar_that_dead_ends_is_the_requests_400(stack: Stack, fields: dict, param: str) -> None:
    reply = chat(stack, "Write something.", max_tokens=32, **fields)
    assert reply.status_code == 400, reply.text
    assert_refused_by_the_worker(reply.json()["error"], param)


@pytest.mark.parametrize(("fields", "param"), DEAD_ENDS)
def test_a_streamed_grammar_that_dead_ends_ends_with_one_error_event(stack: Stack, fields: dict, param: str) -> None:
    body = {"model": stack.config.model_name, "messages": [{"role": "user", "content": "Go."}], "stream": True}
    url = f"{stack.base_url}/v1/chat/completions"
    with requests.post(url, json={**body, "max_tokens": 32, **fields}, headers=auth(stack), stream=True) as reply:
        assert reply.status_code == 200
        frames = data_frames(list(read_frames(reply)))
    assert frames[-1].data == "[DONE]"
    errors = [frame.json["error"] for frame in frames[:-1] if "error" in frame.json]
    assert len(errors) == 1, frames
    assert_refused_by_the_worker(errors[0], param)


def test_the_requests_beside_a_dead_end_finish_as_they_would_alone(stack: Stack) -> None:
    prompts = [f"Tell me about the number {n}." for n in range(4)]
    alone = [chat(stack, prompt, **PLAIN).json()["choices"][0]["message"]["content"] for prompt in prompts]
    with ThreadPoolExecutor(len(prompts) + len(DEAD_ENDS)) as pool:
        plain = [pool.submit(chat, stack, prompt, **PLAIN) for prompt in prompts]
        dead = [pool.submit(chat, stack, "Write something.", max_tokens=32, **fields) for fields, _ in DEAD_ENDS]
        replies = [future.result() for future in plain]
        refusals = [future.result() for future in dead]
    for refusal, (_, param) in zip(refusals, DEAD_ENDS, strict=True):
        assert refusal.status_code == 400, refusal.text
        assert_refused_by_the_worker(refusal.json()["error"], param)
    for reply, text in zip(replies, alone, strict=True):
        assert reply.status_code == 200, reply.text
        choice = reply.json()["choices"][0]
        assert choice["finish_reason"] == "length" and reply.json()["usage"]["completion_tokens"] == 48
        assert choice["message"]["content"] == text, json.dumps(reply.json())
