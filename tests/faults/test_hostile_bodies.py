"""Hostile requests through real HTTP (gunicorn, the api, a worker) on SQLite and PostgreSQL: every one gets its
status in OpenAI's error shape with the `param` it names, and changes nothing: no request, file or batch row, no
queue entry. The table covers numeric bounds, non-finite numbers, NUL and lone surrogates, deep nesting, content
types, sizes (413, chunked too), prompts that cannot fit, URL parts, and the errors gunicorn answers itself."""

from __future__ import annotations

import functools
import json
import socket
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest
import redis
import requests
import sqlalchemy
from transformers import PreTrainedTokenizerFast

from api.chat.prompt_bounds import prompt_char_limit
from scripts.stack import Stack
from tasks.config import REPO_ROOT
from tests.faults.raw_json import with_field, with_raw
from tests.service.http import auth

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
VOCAB_SIZE = 2048  # the tiny model's
MB = 1024 * 1024
DEEP = 100_000


@dataclass(frozen=True)
class Case:
    name: str
    path: str
    body: Callable[[str], bytes]  # the raw body, given the served model's name
    status: int
    param: str | None
    code: str | None = None
    content_type: str | None = "application/json"


def chat(model: str, raw: str = "", **fields: object) -> bytes:
    """A chat body; `raw` is spliced in as one more field, written by hand (NaN, \\ud800, deep nesting)."""
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, **fields}
    return with_field(body, raw)


def completion(model: str, raw: str = "", **fields: object) -> bytes:
    body = {"model": model, "prompt": "hi", "max_tokens": 2, **fields}
    return with_field(body, raw)


def chat_content(model: str, raw_content: str) -> bytes:
    """A chat body whose message content is the raw JSON string text `raw_content` (escapes as written)."""
    return with_raw({"model": model, "messages": [{"role": "user", "content": "@c@"}]}, c=f'"{raw_content}"')


@functools.cache
def past_the_prompt_bound() -> int:
    """One character more than the api's prompt bound for the tiny model the stack serves."""
    model_dir = REPO_ROOT / "models" / "tiny"
    tokenizer = PreTrainedTokenizerFast.from_pretrained(model_dir)
    tokenizer.model_max_length = json.loads((model_dir / "config.json").read_text())["max_position_embeddings"]
    limit = prompt_char_limit(tokenizer)
    assert limit is not None
    return limit + 1


CASES = [
    # numeric bounds, checked at the api with the field named
    Case("top_k huge", CHAT, lambda m: chat(m, top_k=10**30), 400, "top_k"),
    Case("top_k 1e30", CHAT, lambda m: chat(m, raw='"top_k": 1e30'), 400, "top_k"),
    Case("top_k past the vocab", CHAT, lambda m: chat(m, top_k=VOCAB_SIZE + 1), 400, "top_k"),
    Case("seed past int64", COMPLETIONS, lambda m: completion(m, seed=2**63), 400, "seed"),
    Case("seed below int64", COMPLETIONS, lambda m: completion(m, seed=-(2**63) - 1), 400, "seed"),
    Case("temperature string nan", CHAT, lambda m: chat(m, temperature="nan"), 400, "temperature"),
    Case("repetition_penalty", CHAT, lambda m: chat(m, repetition_penalty=11), 400, "repetition_penalty"),
    Case("min_p", CHAT, lambda m: chat(m, min_p=-0.1), 400, "min_p"),
    Case("n huge", CHAT, lambda m: chat(m, n=10**20), 400, "n"),
    Case("max_tokens huge", CHAT, lambda m: chat(m, max_tokens=10**30), 400, "max_tokens", "context_length_exceeded"),
    Case("max_completion_tokens 0", CHAT, lambda m: chat(m, max_completion_tokens=0), 400, "max_completion_tokens"),
    Case("top_logprobs", CHAT, lambda m: chat(m, logprobs=True, top_logprobs=21), 400, "top_logprobs"),
    Case("logprobs", COMPLETIONS, lambda m: completion(m, logprobs=21), 400, "logprobs"),
    Case("min_tokens huge", CHAT, lambda m: chat(m, min_tokens=10**30), 400, "min_tokens"),
    Case("speculative tokens", CHAT, lambda m: chat(m, speculative={"method": "ngram", "num_tokens": 17}), 400,
         "speculative.num_tokens"),
    Case("stop_token_ids huge", CHAT, lambda m: chat(m, stop_token_ids=[10**30]), 400, "stop_token_ids"),
    Case("prompt id huge", COMPLETIONS, lambda m: completion(m, prompt=[10**30]), 400, "prompt"),
    Case("steering vector value", CHAT, lambda m: chat(m, steering={"vectors": [{"layer": 0, "values": [1e5]}]}), 400,
         "steering.vectors.0.values.0"),
    Case("integer of 5000 digits", CHAT, lambda m: chat(m, raw='"seed": ' + "9" * 5000), 400, None, "invalid_json"),
    # numbers JSON has not, which Python's json reads anyway
    Case("NaN", CHAT, lambda m: chat(m, raw='"temperature": NaN'), 400, "temperature", "invalid_number"),
    Case("Infinity", CHAT, lambda m: chat(m, raw='"top_p": Infinity'), 400, "top_p", "invalid_number"),
    Case("1e400", CHAT, lambda m: chat(m, raw='"presence_penalty": -1e400'), 400, "presence_penalty",
         "invalid_number"),
    Case("NaN strength", CHAT, lambda m: chat(m, raw='"steering": {"sae_id": "x", "features": '
         '[{"index": 0, "strength": NaN}]}'), 400, "steering.features.0.strength", "invalid_number"),
    # strings no tokenizer or database takes
    Case("surrogate in content", CHAT, lambda m: chat_content(m, "\\ud800"), 400, "messages.0.content",
         "invalid_string"),
    Case("surrogate in prompt", COMPLETIONS, lambda m: completion(m, raw='"user": "a\\udfff"'), 400, "user",
         "invalid_string"),
    Case("NUL in content", CHAT, lambda m: chat_content(m, "a\\u0000b"), 400, "messages.0.content", "invalid_string"),
    Case("NUL in model", CHAT, lambda m: chat("x\u0000"), 400, "model", "invalid_string"),
    Case("NUL in a key", CHAT, lambda m: chat(m, raw='"a\\u0000": 1'), 400, None, "invalid_string"),
    Case("UTF-8 of a surrogate", CHAT, lambda m: chat(m).replace(b'"hi"', b'"\xed\xa0\x80"'), 400, None,
         "invalid_json"),
    # nesting, shapes and content types
    Case("100k deep", CHAT, lambda m: chat(m, raw='"user": ' + "[" * DEEP + "]" * DEEP), 400, None,
         "json_too_deep"),
    Case("100k deep objects", COMPLETIONS, lambda m: ('{"a":' * DEEP + "1" + "}" * DEEP).encode(), 400, None,
         "json_too_deep"),
    Case("not an object", CHAT, lambda m: b"[1, 2]", 400, None, "invalid_json"),
    Case("text/plain", CHAT, lambda m: chat(m), 400, None, "invalid_content_type", "text/plain"),
    Case("form", COMPLETIONS, lambda m: b"model=x&prompt=y", 400, None, "invalid_content_type",
         "application/x-www-form-urlencoded"),
    Case("no content type", CHAT, lambda m: chat(m), 400, None, "invalid_content_type", None),
    Case("batch create as text", "/v1/batches", lambda m: b"{}", 400, None, "invalid_content_type", "text/plain"),
    Case("NUL in input_file_id", "/v1/batches", lambda m: json.dumps(
        {"input_file_id": "file-\u0000", "endpoint": CHAT, "completion_window": "24h"}).encode(), 400,
         "input_file_id", "invalid_string"),
    # sizes
    Case("10 MB message", CHAT, lambda m: chat_content(m, "a" * (10 * MB)), 413, None, "request_too_large"),
    Case("prompt longer than the context can be", COMPLETIONS,
         lambda m: completion(m, prompt="a" * past_the_prompt_bound()), 400, "prompt", "context_length_exceeded"),
    Case("message longer than the context can be", CHAT, lambda m: chat_content(m, "x" * past_the_prompt_bound()),
         400, "messages", "context_length_exceeded"),
]  # fmt: skip


def counts(stack: Stack) -> dict[str, int]:
    engine = sqlalchemy.create_engine(stack.config.database_url)
    try:
        with engine.connect() as connection:
            tables = ("requests", "files", "batches", "batch_lines")
            rows = {t: connection.execute(sqlalchemy.text(f"SELECT count(*) FROM {t}")).scalar_one() for t in tables}
    finally:
        engine.dispose()
    client = redis.Redis.from_url(stack.config.redis_url)
    return {**rows, "queued": sum(client.llen(queue) for queue in stack.config.worker_queues)}


@pytest.fixture
def unchanged(stack: Stack) -> Iterator[None]:
    """Asserts, after the test, that nothing was recorded or queued."""
    before = counts(stack)
    yield
    assert counts(stack) == before


def assert_openai_error(reply: requests.Response, status: int, param: str | None, code: str | None = None) -> dict:
    assert reply.status_code == status, reply.text[:500]
    assert reply.headers["Content-Type"].startswith("application/json")
    error = reply.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    assert error["type"] == ("invalid_request_error" if status < 500 else "server_error")
    assert error["param"] == param, error
    if code is not None:
        assert error["code"] == code, error
    return error


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_a_hostile_body_is_refused_and_changes_nothing(stack: Stack, case: Case, unchanged: None) -> None:
    headers = auth(stack)
    if case.content_type is not None:
        headers["Content-Type"] = case.content_type
    reply = requests.post(f"{stack.base_url}{case.path}", data=case.body(stack.config.model_name), headers=headers,
                          timeout=30)  # fmt: skip
    assert_openai_error(reply, case.status, case.param, case.code)


def test_a_chunked_body_past_the_limit_is_refused_with_413(stack: Stack, unchanged: None) -> None:
    def chunks() -> Iterator[bytes]:
        yield b'{"model": "x", "prompt": "'
        for _ in range(5):
            yield b"a" * MB
        yield b'"}'

    headers = {**auth(stack), "Content-Type": "application/json"}
    reply = requests.post(f"{stack.base_url}{COMPLETIONS}", data=chunks(), headers=headers, timeout=30)
    assert "Content-Length" not in reply.request.headers
    assert_openai_error(reply, 413, None, "request_too_large")


@pytest.mark.parametrize(
    ("path", "param"),
    [("/v1/batches/batch_x%00", "batch_id"), ("/v1/files/file-x%00/content", "file_id"),
     ("/v1/batches?after=b%00", "after"), ("/v1/requests/chatcmpl-%00", "request_id")],
)  # fmt: skip
def test_nul_in_a_url_part_is_refused(stack: Stack, path: str, param: str, unchanged: None) -> None:
    assert_openai_error(requests.get(f"{stack.base_url}{path}", headers=auth(stack), timeout=10), 400, param)


@pytest.mark.parametrize(
    ("filename", "code"), [("in\x00put.jsonl", "invalid_filename"), ("a" * 600, "invalid_filename")]
)
def test_an_upload_with_an_unstorable_filename_is_refused(
    stack: Stack, filename: str, code: str, unchanged: None
) -> None:
    files = {"file": (filename, b"{}\n")}
    reply = requests.post(f"{stack.base_url}/v1/files", data={"purpose": "batch"}, files=files, headers=auth(stack))
    assert_openai_error(reply, 400, "file", code)


def test_an_upload_past_max_file_bytes_is_refused_before_it_is_read(stack: Stack, unchanged: None) -> None:
    declared = stack.config.max_file_bytes + MB
    reply = raw_http(stack, f"POST /v1/files HTTP/1.1\r\nContent-Length: {declared}\r\n"
                     "Content-Type: multipart/form-data; boundary=x\r\n", body=b"--x")  # fmt: skip
    assert reply.startswith(b"HTTP/1.1 413")
    assert json.loads(reply.partition(b"\r\n\r\n")[2])["error"]["code"] == "request_too_large"


def test_unknown_routes_and_methods_are_openai_shaped(stack: Stack) -> None:
    assert_openai_error(requests.get(f"{stack.base_url}/v1/nothing", headers=auth(stack), timeout=10), 404, None)
    reply = requests.get(f"{stack.base_url}{CHAT}", headers=auth(stack), timeout=10)
    assert_openai_error(reply, 405, None, "method_not_allowed")
    assert "POST" in reply.headers["Allow"]


def raw_http(stack: Stack, head: str, body: bytes = b"") -> bytes:
    """What the server answers to a request written by hand (one requests refuses to send), with the stack's key."""
    key = stack.api_key
    request = f"{head}Host: 127.0.0.1\r\nAuthorization: Bearer {key}\r\nConnection: close\r\n\r\n".encode() + body
    with socket.create_connection((stack.config.host, stack.config.port), timeout=10) as sock:
        sock.sendall(request)
        reply = b""
        while chunk := sock.recv(65536):
            reply += chunk
    return reply


GUNICORN_CASES = [
    # an over-long request line is not here: gunicorn's gevent worker may reset the connection before the client
    # reads its 414 (docs/RELIABILITY.md, What remains)
    ("header field too large", f"GET /v1/models HTTP/1.1\r\nX-Big: {'h' * 10_000}\r\n", 431),
    ("too many header fields", "GET /v1/models HTTP/1.1\r\n" + "".join(f"X-H{i}: v\r\n" for i in range(150)), 431),
    ("malformed request line", "GET /v1/models HTTP/9\r\n", 400),
    ("NUL in Idempotency-Key", "POST /v1/batches HTTP/1.1\r\nIdempotency-Key: a\x00b\r\n", 400),
]


@pytest.mark.parametrize(("head", "status"), [case[1:] for case in GUNICORN_CASES], ids=[c[0] for c in GUNICORN_CASES])
def test_what_gunicorn_answers_itself_is_json_too(stack: Stack, head: str, status: int, unchanged: None) -> None:
    reply = raw_http(stack, head)
    head_bytes, _, body = reply.partition(b"\r\n\r\n")
    assert head_bytes.startswith(f"HTTP/1.1 {status} ".encode()), reply[:300]
    assert b"Content-Type: application/json" in head_bytes
    error = json.loads(body)["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["type"] == "invalid_request_error"
