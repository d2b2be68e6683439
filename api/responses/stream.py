"""A response's typed events as Server-Sent Events: `event: <type>`, `id: <sequence_number>`, `data: <event>`.

They are made from the request's Redis stream, read from its start through the stream hub (tasks/streams/events.py
follow_events), so a client resumes with `starting_after` (or Last-Event-ID) and is sent exactly the events after
it."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Iterator
from typing import Any

import redis
from flask import request

from api.errors import APIError
from api.responses.events import ResponseEvents
from api.services import services
from api.streaming.sse import sse_frame
from tasks.messages.generation import ErrorInfo
from tasks.reapers.orphans import settle_quiet_request
from tasks.store.response_models import ResponseRecord
from tasks.streams.events import STREAM_START, DeadlinePassed, follow_events
from tasks.streams.redis_keys import RedisKeys

logger = logging.getLogger(__name__)
FROM_START = -1  # no event sent yet
SEQUENCE_NUMBER = re.compile(r"[0-9]{1,18}")
TIMED_OUT = ErrorInfo("The response timed out.", "timeout", None, "timeout")
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
    svc = services()
    events = ResponseEvents(record, svc.config.tool_call_parser, load)

    def after_resume_point(typed: list[dict[str, Any]]) -> Iterator[str]:
        yield from (event_frame(event) for event in typed if event["sequence_number"] > after)

    yield ": admitted\n\n"
    yield from after_resume_point(events.opening())
    key = RedisKeys(svc.config.redis_prefix).request_stream(record.request_id)
    try:
        for item in follow_events(
            svc.streams.read_json,
            key,
            STREAM_START,
            idle_s=svc.config.sse_heartbeat_s,
            timeout_s=svc.config.request_timeout_s,
            on_idle=lambda: settle_quiet_request(svc.sessions, svc.redis, svc.config, record.request_id),
        ):
            if item is None:
                yield ": keep-alive\n\n"
                continue
            yield from after_resume_point(events.translate(item[1]))
    except DeadlinePassed:
        on_timeout()
        yield from after_resume_point(events.error(TIMED_OUT))
    except redis.exceptions.RedisError as exc:
        logger.warning("stream of %s broke off: %s", record.id, exc)
        yield from after_resume_point(events.error(INTERRUPTED))
