"""JSON bodies as hostile input: parsed only when shallow enough, with numbers that must be finite and strings that
every consumer (tokenizer, PostgreSQL, Redis) takes. Pure functions; the same checks serve request bodies and batch
lines, and each failure is a 400 naming the field (`param`) where one applies.

Why each check exists:
- depth: Python's json recurses once per level and raises RecursionError near 1,000 levels (a 500); the depth is
  counted first, without recursion, over the body with its strings removed, so 100k levels are refused in
  milliseconds.
- numbers: Python's json reads NaN, Infinity and -Infinity (not JSON) and turns 1e400 into inf.
- strings: a lone UTF-16 surrogate ("\\ud800") is valid JSON but no UTF-8 encoder takes it (the tokenizer and
  psycopg raise); PostgreSQL's text columns refuse NUL."""

from __future__ import annotations

import json
import math
import re
from typing import Any

import numpy as np

from api.errors import APIError

MAX_JSON_DEPTH = 64  # OpenAI's deepest bodies (messages -> content parts, tool schemas) need far fewer levels
# A JSON string, escapes included, written "unrolled" so the regex engine does not backtrack per character.
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_STEPS = np.zeros(256, dtype=np.int32)  # by byte: +1 opens a level, -1 closes one
_STEPS[list(b"[{")], _STEPS[list(b"]}")] = 1, -1


class _NonFinite:
    """Stands where the parser met NaN, Infinity or an overflowing number, so the walk can name the field."""

    def __repr__(self) -> str:
        return "NaN/Infinity"


NON_FINITE = _NonFinite()


def json_depth(raw: bytes) -> int:
    """The deepest nesting of arrays and objects in `raw` (0 for a scalar), brackets inside strings left out."""
    brackets = _JSON_STRING.sub(b"", raw).translate(None, delete=_NOT_BRACKETS)
    if not brackets:
        return 0
    return int(np.cumsum(_STEPS[np.frombuffer(brackets, dtype=np.uint8)]).max())


def unsafe_text_reason(text: str) -> str | None:
    """Why `text` cannot be stored or tokenized, or None when it can."""
    if "\x00" in text:
        return "contains a NUL character (\\u0000)"
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            return "contains a lone UTF-16 surrogate, which is not valid Unicode text"
    return None


def parse_json_object(raw: bytes) -> dict[str, Any]:
    """`raw` as a JSON object whose numbers are finite and whose strings are safe text; APIError 400 otherwise."""
    value = load_json_object(raw)
    check_json_values(value)
    return value


def load_json_object(raw: bytes, max_depth: int = MAX_JSON_DEPTH) -> dict[str, Any]:
    """`raw` as a JSON object, read only if shallow enough, with NON_FINITE where a number is not finite; its values
    are not checked yet (check_json_values)."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise APIError(400, f"The JSON is not valid UTF-8 (at byte {exc.start}).", code="invalid_json") from exc
    num_openers = raw.count(b"[") + raw.count(b"{")  # at least the depth: most bodies need no closer look
    depth = json_depth(raw) if num_openers > max_depth else num_openers
    if depth > max_depth:
        message = f"The JSON is nested {depth} levels deep; at most {max_depth} are allowed."
        raise APIError(400, message, code="json_too_deep")
    try:
        value = json.loads(text, parse_constant=lambda _: NON_FINITE, parse_float=_finite_float)
    except ValueError as exc:  # JSONDecodeError, and integers longer than Python's 4,300-digit limit
        raise APIError(400, f"We could not parse the JSON: {exc}", code="invalid_json") from exc
    if not isinstance(value, dict):
        raise APIError(400, "Send a JSON object.", code="invalid_json")
    return value


def _finite_float(literal: str) -> float | _NonFinite:
    number = float(literal)
    return number if math.isfinite(number) else NON_FINITE


def check_json_values(value: Any) -> None:
    """APIError 400 naming the first field (dotted, as pydantic names them) with a non-finite number or unsafe text;
    `value` is already known to be shallow, so the walk keeps its own stack without fear of its size."""
    pending: list[tuple[str | None, Any]] = [(None, value)]
    while pending:
        path, item = pending.pop()
        if item is NON_FINITE:
            message = f"{path}: NaN, Infinity and numbers beyond a float's range are not valid JSON numbers."
            raise APIError(400, message, param=path, code="invalid_number")
        if isinstance(item, str):
            _check_text(item, path)
        elif isinstance(item, list):
            # only what may fail gets a path: a prompt of token ids is thousands of numbers that cannot
            pending.extend(
                (_join(path, index), element) for index, element in enumerate(item) if type(element) not in _CANNOT_FAIL
            )
        elif isinstance(item, dict):
            for key, element in item.items():
                _check_text(key, path, what="a key")
                if type(element) not in _CANNOT_FAIL:
                    pending.append((_join(path, key), element))


_CANNOT_FAIL = frozenset({int, float, bool, type(None)})  # what JSON parses to, the non-finite marker aside


def _check_text(text: str, path: str | None, what: str = "the value") -> None:
    reason = unsafe_text_reason(text)
    if reason is not None:
        where = f"{path}: " if path else ""
        raise APIError(400, f"{where}{what} {reason}.", param=path, code="invalid_string")


def _join(path: str | None, part: str | int) -> str:
    return str(part) if path is None else f"{path}.{part}"
