"""OpenAI's cursor-paged list object, as `GET /v1/files` and `GET /v1/batches` answer."""

from __future__ import annotations

from typing import Any


def cursor_page(data: list[dict[str, Any]], has_more: bool) -> dict[str, Any]:
    first_id, last_id = (data[0]["id"], data[-1]["id"]) if data else (None, None)
    return {"object": "list", "data": data, "first_id": first_id, "last_id": last_id, "has_more": has_more}
