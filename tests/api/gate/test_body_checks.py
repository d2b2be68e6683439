"""The pure checks on JSON bodies: depth counted without recursion (brackets in strings left out), non-finite numbers
and unsafe strings found with the field that holds them, and gunicorn's own errors written as JSON."""

from __future__ import annotations

import json
import time

import pytest

from api.errors import APIError
from api.gate.body_checks import MAX_JSON_DEPTH, json_depth, parse_json_object, unsafe_text_reason
from api.gunicorn_errors import json_error_response


@pytest.mark.parametrize(
    ("raw", "depth"),
    [
        (b"1", 0),
        (b"{}", 1),
        (b'{"a": [1, {"b": []}]}', 4),
        (b'{"a": "[[[[{{{{"}', 1),
        (b'{"a": "quote \\" then [[[["}', 1),
        (b'["\\\\", [["x"]]]', 3),
        (b"[" * 1000 + b"]" * 1000, 1000),
    ],
)
def test_depth_counts_nesting_outside_strings(raw: bytes, depth: int) -> None:
    assert json_depth(raw) == depth


@pytest.mark.parametrize("raw", [b"[" * 100_000 + b"]" * 100_000, b'{"a":' * 100_000 + b"1" + b"}" * 100_000])
def test_100k_levels_are_refused_fast_without_recursion(raw: bytes) -> None:
    started = time.perf_counter()
    with pytest.raises(APIError) as refused:
        parse_json_object(raw)
    assert refused.value.status == 400 and refused.value.info.code == "json_too_deep"
    assert time.perf_counter() - started < 0.5


def test_the_deepest_allowed_body_parses() -> None:
    raw = b'{"a": ' + b"[" * (MAX_JSON_DEPTH - 1) + b"]" * (MAX_JSON_DEPTH - 1) + b"}"
    assert json_depth(raw) == MAX_JSON_DEPTH and "a" in parse_json_object(raw)


@pytest.mark.parametrize(
    ("text", "reason"),
    [("fine ✓ 😀", None), ("a\x00b", "NUL"), ("\ud800", "surrogate"), ("x\udfffy", "surrogate"),
     ("\ud83d\ude00", "surrogate")],  # a pair as two code points: what json makes of it is one character
)  # fmt: skip
def test_unsafe_text(text: str, reason: str | None) -> None:
    found = unsafe_text_reason(text)
    assert (found is None) if reason is None else (reason in found)  # type: ignore[operator]


@pytest.mark.parametrize(
    ("raw", "param", "code"),
    [
        (b'{"temperature": NaN}', "temperature", "invalid_number"),
        (b'{"a": {"b": [1, -Infinity]}}', "a.b.1", "invalid_number"),
        (b'{"x": 1e400}', "x", "invalid_number"),
        (b'{"messages": [{"content": "\\ud800"}]}', "messages.0.content", "invalid_string"),
        (b'{"messages": [{"content": "ok"}, {"name": "a\\u0000"}]}', "messages.1.name", "invalid_string"),
        (b'{"meta": {"k\\u0000": "v"}}', "meta", "invalid_string"),
        (b'{"x": 1', None, "invalid_json"),
        (b'[{"x": 1}]', None, "invalid_json"),
        (b'{"x": "\xed\xa0\x80"}', None, "invalid_json"),
        (b'{"x": ' + b"9" * 5000 + b"}", None, "invalid_json"),
    ],
)
def test_a_bad_value_is_refused_naming_its_field(raw: bytes, param: str | None, code: str) -> None:
    with pytest.raises(APIError) as refused:
        parse_json_object(raw)
    assert refused.value.status == 400
    assert (refused.value.info.param, refused.value.info.code) == (param, code)


def test_good_json_parses_as_it_is() -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "héllo 😀 \\ [x]"}], "temperature": 0.5}
    assert parse_json_object(json.dumps(body).encode()) == body


def test_gunicorn_errors_are_openai_shaped_json() -> None:
    head, _, body = json_error_response(431, "Request Header Fields Too Large", "Error parsing headers").partition(
        b"\r\n\r\n"
    )
    assert head.startswith(b"HTTP/1.1 431 Request Header Fields Too Large\r\n")
    assert b"Content-Type: application/json" in head and f"Content-Length: {len(body)}".encode() in head
    assert json.loads(body) == {
        "error": {
            "message": "Error parsing headers",
            "type": "invalid_request_error",
            "param": None,
            "code": "request_header_fields_too_large",
        }
    }
