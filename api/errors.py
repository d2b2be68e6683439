"""Errors in OpenAI's shape: {"error": {"message", "type", "param", "code"}}; never a traceback to a client."""

from __future__ import annotations

import logging

import kombu.exceptions
import redis.exceptions
import sqlalchemy.exc
from flask import Flask, Response, jsonify
from pydantic import ValidationError
from werkzeug.exceptions import HTTPException

from api.observability.api_metrics import count_backend_error
from tasks.messages.generation import ErrorInfo

logger = logging.getLogger(__name__)

UNAVAILABLE_ERRORS = (
    redis.exceptions.ConnectionError,
    redis.exceptions.TimeoutError,
    kombu.exceptions.OperationalError,
    sqlalchemy.exc.OperationalError,
    sqlalchemy.exc.InterfaceError,
)
UNAVAILABLE_RETRY_AFTER_S = 2  # a Redis restart or a database failover usually takes a few seconds


class APIError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.info = ErrorInfo(message=message, type=type, param=param, code=code)
        self.headers = headers or {}  # e.g. Retry-After on 429 and 503


def error_response(status: int, info: ErrorInfo, headers: dict[str, str] | None = None) -> tuple[Response, int]:
    response = jsonify({"error": info.to_dict()})
    response.headers.update(headers or {})
    return response, status


def validation_error_info(exc: ValidationError) -> ErrorInfo:
    first = exc.errors()[0]
    param = ".".join(str(part) for part in first["loc"]) or None
    if first["type"] == "extra_forbidden":
        return ErrorInfo(f"Unrecognized request argument supplied: {param}", "invalid_request_error", param)
    message = first["msg"].removeprefix("Value error, ")
    return ErrorInfo(f"{param}: {message}" if param else message, "invalid_request_error", param, first["type"])


def register_error_handlers(app: Flask) -> None:
    app.register_error_handler(APIError, lambda exc: error_response(exc.status, exc.info, exc.headers))
    app.register_error_handler(ValidationError, lambda exc: error_response(400, validation_error_info(exc)))
    app.register_error_handler(HTTPException, _http_error)
    for error_class in UNAVAILABLE_ERRORS:
        app.register_error_handler(error_class, unavailable)
    app.register_error_handler(Exception, _unexpected)


def _http_error(exc: HTTPException) -> tuple[Response, int]:
    """werkzeug's errors (404, 405, 413, ...) in OpenAI's shape, keeping their headers (405's Allow)."""
    status = exc.code or 500
    error_type = "invalid_request_error" if status < 500 else "server_error"
    code = exc.name.lower().replace(" ", "_")
    response, status = error_response(status, ErrorInfo(exc.description or exc.name, error_type, None, code))
    for name, value in exc.get_headers():
        if name.lower() != "content-type":
            response.headers[name] = value
    return response, status


def unavailable(exc: Exception) -> tuple[Response, int]:
    logger.warning("backing service unavailable: %s", exc)
    count_backend_error(exc)
    message = "A backing service (Redis or the database) is unavailable; retry shortly."
    info = ErrorInfo(message, "service_unavailable", None, "service_unavailable")
    return error_response(503, info, {"Retry-After": str(UNAVAILABLE_RETRY_AFTER_S)})


def _unexpected(exc: Exception) -> tuple[Response, int]:
    logger.exception("unhandled error")
    return error_response(500, ErrorInfo("The server had an error processing your request.", "server_error"))
