"""A response's typed events as Server-Sent Events: `event: <type>`, `id: <sequence_number>`, `data: <event>`.

They are made from the request's Redis stream, read from its start (api/streaming/typed_events.py), so a client
resumes with `starting_after` (or Last-Event-ID) and is sent exactly the events after it."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from typing import Any

from flask import request

from api.errors import APIError
from api.responses.events import ResponseEvents
from api.services import services
from api.streaming.sse import sse_comment, sse_frame
from api.streaming.typed_events import translated_events
from tasks.messages.generation import ErrorInfo
from tasks.store.response_models import ResponseRecord

FROM_START = -1  # no event sent yet
SEQUENCE_NUMBER = re.compile(r"[0-9]{1,18}")
INTERRUPTED = ErrorInfo(
    "The event stream was interrupted; resume with starting_after.", "service_unavailable", None, "service_unavailable"
)


def starting_after() -> int:
    """Where a resuming client left off: ?starting_after=N, or else an EventSource's Last-Event-ID; each is checked
    when given, even where it is not used (an empty one is not given)."""
    header = request.headers.get("Last-Event-ID")
    given = {"starting_after": request.args.get("starting_after"), "Last-Event-ID": header}
    for name, value in given.items():
        if value and not SEQUENCE_NUMBER.fullmatch(value):  # not str.isdigit: "²" is a digit to it, not to int()
            raise APIError(400, f"{name} must be a sequence number (an integer >= 0).", param=name)
    value = given["starting_after"] or given["Last-Event-ID"] or None
    return FROM_START if value is None else int(value)


def event_frame(event: dict[str, Any]) -> str:
    return f"event: {event['type']}\n" + sse_frame(json.dumps(event), str(event["sequence_number"]))


def response_frames(
    record: ResponseRecord, after: int, load: Callable[[], ResponseRecord], on_timeout: Callable[[], None]
) -> Iterator[str]:
    """Frames of the events numbered after `after`, through the response's terminal event; a comment whenever the
    heartbeat passes quietly (and at once, so the client has the headers before the first token)."""
    events = ResponseEvents(record, services().config.tool_call_parser, load)

    def after_resume_point(typed: list[dict[str, Any]]) -> Iterator[str]:
        yield from (event_frame(event) for event in typed if event["sequence_number"] > after)

    yield sse_comment("admitted")
    yield from after_resume_point(events.opening())
    for typed in translated_events(record.request_id, events, on_timeout, INTERRUPTED):
        if typed is None:
            yield sse_comment("keep-alive")
        else:
            yield from after_resume_point(typed)
