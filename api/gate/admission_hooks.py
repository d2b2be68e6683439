"""The admission gate's hooks on the app: a generation request takes one of the process's slots
(`api/gate/admission_slots.py`) before anything else is done for it, waiting in line for its turn, or, when its turn
would not come within ADMISSION_WAIT_S, is refused with 429 `server_busy` and a retry hint for when it would; the slot
goes back once the request is enqueued, or when its view ends."""

from __future__ import annotations

import math

from flask import Flask, g, request

from api.errors import APIError
from api.observability.api_metrics import count_rejection
from api.services import services

# The views that admit generation: each takes a slot before authentication, so a burst waits on the gate, not on
# the SQL pool that /health and every other route share.
GATED_ENDPOINTS = frozenset(
    {
        "chat.create_chat_completion",
        "completions.create_completion",
        "responses.create",
        "messages.create",
        "embeddings.create_embedding",
    }
)


def register_admission_gate(app: Flask) -> None:
    """The services' gate as the app's first before_request hook (before authentication), and its slot given back
    when the request's context ends, for a request that did not give it back itself."""
    app.before_request_funcs.setdefault(None, []).insert(0, take_admission_slot)
    app.teardown_request(lambda _exc: release_admission_slot())


def take_admission_slot() -> None:
    if request.endpoint not in GATED_ENDPOINTS:
        return
    gate = services().admission_gate
    acquired_at = gate.acquire()
    if acquired_at is None:
        _drain_body()
        count_rejection(services().model_info.name, "server_busy")  # the body is not parsed: the default model
        retry_after_s = gate.retry_after_s()
        raise APIError(
            429,
            "This server is admitting as many requests as it can; retry after the time in Retry-After.",
            type="rate_limit_exceeded",
            code="server_busy",
            headers={"Retry-After": str(math.ceil(retry_after_s)), "retry-after-ms": str(round(retry_after_s * 1000))},
        )
    g.admission_slot = acquired_at


def release_admission_slot() -> None:
    """Gives this request's slot back, if it holds one: once it is enqueued, or when its view ends."""
    acquired_at = g.pop("admission_slot", None)
    if acquired_at is not None:
        services().admission_gate.release(acquired_at)


def _drain_body() -> None:
    """Reads a refused request's body (within the size limit) before answering: a socket closed with unread input
    is reset, and a reset can destroy the 429 before the client reads it."""
    if request.content_length is not None and request.content_length <= services().config.max_request_bytes:
        request.get_data(cache=False)
