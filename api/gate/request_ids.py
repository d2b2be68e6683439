"""The `x-request-id` header every response carries: the client's own `X-Request-Id` when it sent a sane one, else
the generated request's id (chat, completions and messages), else a fresh id. The openai client reads it as
`_request_id`; the Messages API's routes send the same id as Anthropic's `request-id` too."""

from __future__ import annotations

import re
import uuid

from flask import Response, g, request

HEADER = "X-Request-Id"
SANE_REQUEST_ID = re.compile(r"^[\x21-\x7e]{1,128}$")  # printable ASCII, no spaces: safe to echo and to log


def note_request_id(request_id: str) -> None:
    """The id this request created (a chat or completion's), for the response header."""
    g.request_id = request_id


def response_request_id() -> str:
    """The id this request's response names, the same wherever it is asked for."""
    if "response_request_id" not in g:
        sent = request.headers.get(HEADER, "")
        g.response_request_id = (
            sent if SANE_REQUEST_ID.match(sent) else g.get("request_id") or f"req_{uuid.uuid4().hex}"
        )
    return g.response_request_id


def add_request_id_header(response: Response) -> Response:
    response.headers[HEADER] = response_request_id()
    return response
