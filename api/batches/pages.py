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


def ordered_item_page(items: list[dict[str, Any]], limit: int, item_name: str) -> dict[str, Any]:
    """A list of items kept oldest first, paged as OpenAI pages items: `?order=` (desc, newest first, by default) and
    `?after=` (an item id; an unknown one is a 404 naming it as `item_name`)."""
    order = request.args.get("order", "desc")
    if order not in ("asc", "desc"):
        raise APIError(400, "order must be asc or desc.", param="order")
    ordered = list(reversed(items)) if order == "desc" else list(items)
    after = request.args.get("after")
    if after is not None:
        ids = [item["id"] for item in ordered]
        if after not in ids:
            raise APIError(404, f"{item_name} with id '{after}' not found.", param="after", code="not_found")
        ordered = ordered[ids.index(after) + 1 :]
    return cursor_page(ordered[:limit], has_more=len(ordered) > limit)
