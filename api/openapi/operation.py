"""What the OpenAPI document says about one view: its request and response models, parameters and error codes. The
path, its path parameters and the method come from the app's URL map, so a route is described once, by its
endpoint name, in api/openapi/routes.py."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

# Every authenticated route may answer these: a bad URL part or header, no key, a URL too long for the server, a
# backing service down, a bug.
COMMON_ERRORS = (400, 401, 414, 431, 500, 503)
ERROR_DESCRIPTIONS = {
    400: "Invalid request: a body, parameter or header failed validation",
    401: "No key, or an unknown or revoked one",
    403: "The key may not do this (admin scope needed)",
    404: "No such object, or another tenant's",
    409: "The Idempotency-Key was used before with a different request",
    410: "The event stream has expired; GET the object for its result",
    413: "The request body is over the endpoint's limit",
    414: "The request line is over the server's limit (answered by gunicorn, in the same shape)",
    431: "Too many or too large header fields (answered by gunicorn, in the same shape)",
    429: "A queue cap, the key's rate limit, or a burst beyond what the api admits at once; retry after Retry-After",
    500: "The server had an error",
    503: "Redis or the database is unavailable, or no worker serves the model; retry after Retry-After seconds",
    504: "The request timed out and was cancelled",
}
RETRY_AFTER_CODES = (429, 503)
GUNICORN_ERRORS = (414, 431)  # answered before the app sees the request: always OpenAI's shape


@dataclass(frozen=True)
class Operation:
    """One route's contract. `body`: a JSON request body; `form`: a multipart one; `response`: the 200 JSON body;
    `stream`: the 200 text/event-stream's data events (with `response`, the body's `stream` field picks);
    `is_done_terminated`: the stream ends with `data: [DONE]` (the Responses API's ends with its terminal event);
    `content_type`: a 200 of another media type; `unavailable`: the route's own 503 body, besides the error one;
    `example`: a request body for the served model's name; `links`: OpenAPI links to the routes that take the
    created object's id (a fuzzer follows them: create, then read, then delete); `error`: the route's error body, when
    it is not OpenAI's (the Messages API answers in Anthropic's shape)."""

    summary: str
    tag: str
    response: type[BaseModel] | None = None
    body: type[BaseModel] | None = None
    form: type[BaseModel] | None = None
    stream: tuple[type[BaseModel], ...] = ()
    is_done_terminated: bool = True
    content_type: str | None = None
    unavailable: type[BaseModel] | None = None
    parameters: tuple[dict[str, Any], ...] = ()
    errors: tuple[int, ...] = ()
    example: Callable[[str], dict[str, Any]] | None = None
    links: tuple[str, ...] = ()  # endpoints whose path parameter takes this 200's `id`
    error: type[BaseModel] | None = None  # None: OpenAI's ErrorResponse

    @property
    def request_models(self) -> list[type[BaseModel]]:
        return [model for model in (self.body, self.form) if model is not None]

    @property
    def response_models(self) -> list[type[BaseModel]]:
        return [model for model in (self.response, *self.stream, self.unavailable, self.error) if model is not None]

    def error_codes(self, *, is_public: bool) -> list[int]:
        """`is_public`: served without a key (api/gate/auth.py's OPEN_ENDPOINTS), so never a 401."""
        return sorted({*COMMON_ERRORS, *self.errors} - ({401} if is_public else set()))


def query(name: str, schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"name": name, "in": "query", "required": False, "schema": schema, "description": description}


def header(name: str, schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"name": name, "in": "header", "required": False, "schema": schema, "description": description}
