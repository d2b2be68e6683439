"""OpenAI's cursor-paged list object, as `GET /v1/files` and `GET /v1/batches` answer, and their `?limit=`."""

from __future__ import annotations

from typing import Any

from flask import request

from api.errors import APIError


def page_limit(default: int, maximum: int) -> int:
    """`?limit=` as an integer in [1, maximum]; anything else is a 400 (Flask's `type=int` would quietly use the
    default)."""
    raw = request.args.get("limit", str(default))
    limit = int(raw) if raw.isascii() and raw.isdigit() else 0
    if not 1 <= limit <= maximum:
        raise APIError(400, f"limit must be an integer in [1, {maximum}]", param="limit")
    return limit


def cursor_page(data: list[dict[str, Any]], has_more: bool) -> dict[str, Any]:
    first_id, last_id = (data[0]["id"], data[-1]["id"]) if data else (None, None)
    return {"object": "list", "data": data, "first_id": first_id, "last_id": last_id, "has_more": has_more}
