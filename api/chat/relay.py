"""A generation request's Redis stream relayed as chat or completion chunks over Server-Sent Events, resumable from any
frame's id.

A DELTA entry of a streamed request carries its payloads as the worker encoded them (tasks/messages/stream_chunks.py):
they go out as they are, so a token costs the relay no JSON decoding, chunk building or encoding; the other entries
(START, FINAL, and every entry of a stream written without payloads) are made into chunks here. The frames of all the
entries that one read brings go out in one write."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterator

import redis

from api.streaming.sse import DONE, RETRY_MS, ResumePoint, frame_id, sse_comment, sse_frame
from tasks.messages.generation import ErrorInfo, EventType, StreamEvent
from tasks.messages.stream_chunks import StreamMeta, decode_payloads, stream_chunks
from tasks.streams.events import CHUNKS_FIELD, DeadlinePassed, EntryReader, entry_json

logger = logging.getLogger(__name__)


def relay_frames(
    read: EntryReader,
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
    an event with empty data); an error frame carries the id of the frame before it. Each item yielded is every
    frame of one read's entries (one socket write), or one comment."""
    yield sse_comment("admitted")
    start = ResumePoint.parse(after_id)
    sent_id = after_id
    retry_ms: int | None = RETRY_MS
    deadline = time.monotonic() + timeout_s
    try:
        for batch in read(key, start.read_after, int(heartbeat_s * 1000)):
            if time.monotonic() >= deadline:
                raise DeadlinePassed(key)
            if batch is None:
                on_idle()
                yield sse_comment("keep-alive")
                continue
            frames, is_final = [], False
            for entry_id, fields in batch:
                payloads, is_final = _payloads(meta, fields)
                for sent_id, payload in _frames_to_send(entry_id, payloads, start):
                    frames.append(sse_frame(payload, sent_id, retry_ms))
                    retry_ms = None
                if is_final:
                    break
            if frames:
                yield "".join(frames)
            if is_final:
                return
    except DeadlinePassed:
        yield from _timed_out(on_timeout, sent_id, retry_ms)
    except redis.exceptions.RedisError as exc:
        logger.warning("stream %s broke off: %s", key, exc)
        error = ErrorInfo("The event stream was interrupted; reconnect with Last-Event-ID.", "service_unavailable")
        yield sse_frame(json.dumps({"error": error.to_dict()}), sent_id, retry_ms)


def _payloads(meta: StreamMeta, fields: dict[str, str]) -> tuple[list[str], bool]:
    """(the SSE payloads of one entry, whether it is the final one: its payloads end with [DONE])."""
    if CHUNKS_FIELD in fields:  # only DELTAs carry them
        return decode_payloads(fields[CHUNKS_FIELD]), False
    event = StreamEvent.from_dict(entry_json(fields))
    payloads = [json.dumps(chunk) for chunk in stream_chunks(meta, event)]
    if event.type == EventType.FINAL:
        payloads.append(DONE)
    return payloads, event.type == EventType.FINAL


def _frames_to_send(entry_id: str, payloads: list[str], start: ResumePoint) -> list[tuple[str, str]]:
    """(id, data) of the frames made from one stream entry that the client lacks; [DONE] it gets again."""
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
