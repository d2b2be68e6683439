"""What every request may carry before a view reads it: a body of at most MAX_REQUEST_BYTES (MAX_FILE_BYTES and a
form's overhead for an upload), refused with 413 before it is read, chunked ones included; URL parts and stored
headers without NUL or lone surrogates; and JSON bodies read through `read_json_object` (api/gate/body_checks.py)."""

from __future__ import annotations

from flask import Flask, request
from werkzeug.exceptions import RequestEntityTooLarge

from api.errors import APIError
from api.gate.body_checks import parse_json_object, unsafe_text_reason
from api.services import services
from tasks.config import Config

UPLOAD_ENDPOINTS = frozenset({"files.create_file"})
MULTIPART_OVERHEAD = 64 * 1024  # an upload's form boundaries and other fields, on top of the file itself
CHECKED_HEADERS = ("Idempotency-Key",)  # headers stored in SQL as they come (Last-Event-ID has its own pattern)


def register_request_limits(app: Flask, config: Config) -> None:
    """The limits as Flask's own default (a body read outside any view is bounded too) and as a before_request
    hook, which runs after authentication: an unauthenticated client learns nothing about limits."""
    app.config["MAX_CONTENT_LENGTH"] = config.max_request_bytes
    app.before_request(check_request)


def body_limit(endpoint: str | None, config: Config) -> int:
    if endpoint in UPLOAD_ENDPOINTS:
        return config.max_file_bytes + MULTIPART_OVERHEAD
    return config.max_request_bytes


def check_request() -> None:
    """413 for a declared length over the endpoint's limit (a chunked body is cut off at the limit as it is read);
    400 naming the part for NUL or a lone surrogate in a URL part or a checked header."""
    limit = body_limit(request.endpoint, services().config)
    request.max_content_length = limit
    if request.content_length is not None and request.content_length > limit:
        raise too_large(limit)
    parts = [*(request.view_args or {}).items(), *request.args.items(multi=True)]
    parts += [(name, request.headers[name]) for name in CHECKED_HEADERS if name in request.headers]
    for name, value in parts:
        reason = unsafe_text_reason(value) if isinstance(value, str) else None
        if reason is not None:
            raise APIError(400, f"{name}: the value {reason}.", param=name, code="invalid_string")


def too_large(limit: int) -> APIError:
    message = f"The request body is larger than this endpoint's limit of {limit} bytes."
    return APIError(413, message, code="request_too_large")


def read_json_object() -> dict:
    """The body of a JSON endpoint: application/json, within the size limit, a checked JSON object."""
    if not request.is_json:
        message = f"Content-Type must be application/json, not {request.mimetype or 'none'!r}."
        raise APIError(400, message, code="invalid_content_type")
    limit = request.max_content_length or 0
    try:
        raw = request.get_data(cache=True)
    except RequestEntityTooLarge as exc:
        raise too_large(limit) from exc
    if request.content_length is None and len(raw) >= limit:  # a chunked body, cut off by werkzeug at the limit
        raise too_large(limit)
    return parse_json_object(raw)
