"""The `x-request-id` header every response carries: the client's own `X-Request-Id` when it sent a sane one, else
the generated request's id (chat and completions), else a fresh id. The openai client reads it as `_request_id`."""

from __future__ import annotations

import re
import uuid

from flask import Response, g, request

HEADER = "X-Request-Id"
SANE_REQUEST_ID = re.compile(r"^[\x21-\x7e]{1,128}$")  # printable ASCII, no spaces: safe to echo and to log


def note_request_id(request_id: str) -> None:
    """The id this request created (a chat or completion's), for the response header."""
    g.request_id = request_id


def add_request_id_header(response: Response) -> Response:
    sent = request.headers.get(HEADER, "")
    if SANE_REQUEST_ID.match(sent):
        response.headers[HEADER] = sent
    else:
        response.headers[HEADER] = g.get("request_id") or f"req_{uuid.uuid4().hex}"
    return response
