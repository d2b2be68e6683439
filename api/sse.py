"""Relay a request's Redis stream as Server-Sent Events, resumable by stream entry id."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Iterator

import redis
from flask import Response, request, stream_with_context

from api.errors import APIError
from api.responses import StreamMeta, stream_chunks
from tasks.messages import ErrorInfo, EventType
from tasks.streams import STREAM_START, DeadlinePassed, JsonReader, entry_order, follow_events

logger = logging.getLogger(__name__)
ENTRY_ID = re.compile(r"^\d+-\d+$")
RETRY_MS = 1000  # how long a dropped EventSource waits before it reconnects with Last-Event-ID


def last_event_id() -> str:
    """Where a reconnecting client left off: the Last-Event-ID header, or ?last_event_id= for curl."""
    value = request.headers.get("Last-Event-ID") or request.args.get("last_event_id") or STREAM_START
    if not ENTRY_ID.match(value):
        raise APIError(400, "Last-Event-ID must be a stream entry id like 1700000000000-0", param="Last-Event-ID")
    try:
        entry_order(value)  # one process's reads share an XREAD, which one id out of range would fail for all
    except ValueError as exc:
        raise APIError(400, f"Last-Event-ID: {exc}", param="Last-Event-ID") from exc
    return value


def sse_frame(data: str, event_id: str | None = None, retry_ms: int | None = None) -> str:
    prefix = f"id: {event_id}\n" if event_id else ""
    if retry_ms is not None:
        prefix = f"retry: {retry_ms}\n{prefix}"
    return f"{prefix}data: {data}\n\n"


def relay_frames(
    read: JsonReader,
    key: str,
    meta: StreamMeta,
    after_id: str,
    *,
    heartbeat_s: float,
    timeout_s: float,
    on_timeout: Callable[[], None] | None = None,
    on_idle: Callable[[], object] = lambda: None,
) -> Iterator[str]:
    """Frames until the final event, then [DONE]; a comment whenever heartbeat_s passes quietly.

    Only the last frame made from a stream entry carries its id, so a client that drops between the frames of one
    entry resumes before that entry and misses none of them. A comment goes out at once: it sends the response's
    headers, so a client knows its request was admitted before the first token exists. The first event carries
    `retry:` (a block of `retry:` alone would reach the openai client as an event with empty data)."""
    yield ": admitted\n\n"
    retry_ms: int | None = RETRY_MS
    try:
        for item in follow_events(read, key, after_id, idle_s=heartbeat_s, timeout_s=timeout_s, on_idle=on_idle):
            if item is None:
                yield ": keep-alive\n\n"
                continue
            entry_id, event = item
            payloads = [json.dumps(chunk) for chunk in stream_chunks(meta, event)]
            if event.type == EventType.FINAL:
                payloads.append("[DONE]")
            for index, payload in enumerate(payloads):
                yield sse_frame(payload, entry_id if index == len(payloads) - 1 else None, retry_ms)
                retry_ms = None
    except DeadlinePassed:
        yield from _timed_out(on_timeout)
    except redis.exceptions.RedisError as exc:
        logger.warning("stream %s broke off: %s", key, exc)
        error = ErrorInfo("The event stream was interrupted; reconnect with Last-Event-ID.", "service_unavailable")
        yield sse_frame(json.dumps({"error": error.to_dict()}))


def _timed_out(on_timeout: Callable[[], None] | None) -> Iterator[str]:
    if on_timeout is not None:
        on_timeout()
    error = ErrorInfo("The request timed out.", "timeout", None, "timeout")
    yield sse_frame(json.dumps({"error": error.to_dict()}))


def sse_response(frames: Iterator[str], on_abandon: Callable[[], None] | None = None) -> Response:
    """`on_abandon` runs when the client leaves before the frames run out."""

    def guarded() -> Iterator[str]:
        is_complete = False
        try:
            yield from frames
            is_complete = True
        finally:
            if not is_complete and on_abandon is not None:
                on_abandon()

    response = Response(stream_with_context(guarded()), mimetype="text/event-stream")
    response.headers["Cache-Control"] = "no-cache"
    response.headers["X-Accel-Buffering"] = "no"
    return response
