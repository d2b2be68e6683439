"""JSON written with raw parts json.dumps would never write (NaN, 1e400, \\ud800, 100k levels of nesting)."""

from __future__ import annotations

import json
from typing import Any


def with_raw(value: Any, **raw: str) -> bytes:
    """`value` as JSON, each string "@name@" in it replaced by the raw JSON text `raw[name]`."""
    text = json.dumps(value)
    for name, part in raw.items():
        text = text.replace(json.dumps(f"@{name}@"), part)
    return text.encode()


def with_field(body: dict[str, Any], raw_field: str = "") -> bytes:
    """`body` as a JSON object with one more member written by hand (`"name": raw value`), when one is given."""
    text = json.dumps(body)
    return (text[:-1] + ", " + raw_field + "}").encode() if raw_field else text.encode()
