"""A generation request's Redis stream relayed as chat or completion chunks over Server-Sent Events, resumable from any
frame's id."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator

import redis

from api.chat.objects import StreamMeta, stream_chunks
from api.streaming.sse import DONE, RETRY_MS, ResumePoint, frame_id, sse_comment, sse_frame
from tasks.messages.generation import ErrorInfo, EventType, StreamEvent
from tasks.streams.events import DeadlinePassed, JsonReader, follow_events

logger = logging.getLogger(__name__)


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

    `after_id` is a frame id (`FRAME_ID`): every frame's id says what the client has once it has that frame, so
    resuming from any of them loses and repeats nothing, and resuming after the final entry gets [DONE] at once. A
    comment goes out at once: it sends the response's headers, so a client knows its request was admitted before the
    first token exists. The first frame carries `retry:` (a block of `retry:` alone would reach the openai client as
    an event with empty data); an error frame carries the id of the frame before it."""
    yield sse_comment("admitted")
    start = ResumePoint.parse(after_id)
    sent_id = after_id
    retry_ms: int | None = RETRY_MS
    try:
        events = follow_events(read, key, start.read_after, idle_s=heartbeat_s, timeout_s=timeout_s, on_idle=on_idle)
        for item in events:
            if item is None:
                yield sse_comment("keep-alive")
                continue
            for sent_id, payload in _frames_to_send(meta, *item, start):
                yield sse_frame(payload, sent_id, retry_ms)
                retry_ms = None
    except DeadlinePassed:
        yield from _timed_out(on_timeout, sent_id, retry_ms)
    except redis.exceptions.RedisError as exc:
        logger.warning("stream %s broke off: %s", key, exc)
        error = ErrorInfo("The event stream was interrupted; reconnect with Last-Event-ID.", "service_unavailable")
        yield sse_frame(json.dumps({"error": error.to_dict()}), sent_id, retry_ms)


def _frames_to_send(meta: StreamMeta, entry_id: str, event: StreamEvent, start: ResumePoint) -> list[tuple[str, str]]:
    """(id, data) of the frames made from one stream entry that the client lacks; [DONE] it gets again."""
    payloads = [json.dumps(chunk) for chunk in stream_chunks(meta, event)]
    if event.type == EventType.FINAL:
        payloads.append(DONE)
    return [
        (frame_id(entry_id, index, len(payloads)), payload)
        for index, payload in enumerate(payloads)
        if payload == DONE or not start.has(entry_id, index)
    ]


def _timed_out(on_timeout: Callable[[], None] | None, sent_id: str, retry_ms: int | None) -> Iterator[str]:
    if on_timeout is not None:
        on_timeout()
    error = ErrorInfo("The request timed out.", "timeout", None, "timeout")
    yield sse_frame(json.dumps({"error": error.to_dict()}), sent_id, retry_ms)
