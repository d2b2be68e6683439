"""Server-Sent Events: frames and their ids, where a reconnecting client left off (Last-Event-ID), and the streamed
response, renewing the stream attachment it holds."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

from flask import Response, request, stream_with_context

from api.errors import APIError
from tasks.streams.attachments import StreamAttachment
from tasks.streams.events import STREAM_START, entry_before, entry_order

ENTRY_ID = re.compile(r"^(\d+-\d+)$")
# A request stream's frame id: its entry's id once every frame made from that entry is sent, else the entry's id and
# how many of its frames are ("1700000000000-4:1").
FRAME_ID = re.compile(r"^(\d+-\d+)(?::(\d{1,6}))?$")
RETRY_MS = 1000  # how long a dropped EventSource waits before it reconnects with Last-Event-ID
DONE = "[DONE]"


def last_event_id(pattern: re.Pattern[str] = ENTRY_ID) -> str:
    """Where a reconnecting client left off: the Last-Event-ID header, or ?last_event_id= for curl. Each one given is
    checked, so a malformed query beside a good header is refused rather than silently ignored."""
    given = [(value, param) for value, param in _event_id_sources() if value]
    for value, param in given:
        _check_event_id(value, param, pattern)
    return given[0][0] if given else STREAM_START


def _event_id_sources() -> list[tuple[str | None, str]]:
    return [
        (request.headers.get("Last-Event-ID"), "Last-Event-ID"),
        (request.args.get("last_event_id"), "last_event_id"),
    ]


def _check_event_id(value: str, param: str, pattern: re.Pattern[str]) -> None:
    match = pattern.match(value)
    if match is None:
        raise APIError(400, f"{param} must be an event id like 1700000000000-0", param=param)
    try:
        entry_order(match.group(1))  # one process's reads share an XREAD, which one id out of range would fail for all
    except ValueError as exc:
        raise APIError(400, f"{param}: {exc}", param=param) from exc


@dataclass(frozen=True)
class ResumePoint:
    """What a client already has: the frames of the stream up to entry `entry_id`, and `num_frames` frames of that
    entry (None: all of them). Parsed from a `FRAME_ID` that `last_event_id` checked."""

    entry_id: str
    num_frames: int | None

    @classmethod
    def parse(cls, event_id: str) -> ResumePoint:
        match = FRAME_ID.match(event_id)
        if match is None:
            raise ValueError(f"{event_id!r} is not a frame id")
        return cls(match.group(1), None if match.group(2) is None else int(match.group(2)))

    @property
    def read_after(self) -> str:
        """Where to read the stream from: just before `entry_id`, whose frames may not all have been sent."""
        return entry_before(self.entry_id)

    def has(self, entry_id: str, index: int) -> bool:
        return entry_id == self.entry_id and (self.num_frames is None or index < self.num_frames)


def frame_id(entry_id: str, index: int, num_frames: int) -> str:
    """The id of frame `index` of the `num_frames` made from a stream entry: resuming from it loses and repeats none."""
    return entry_id if index == num_frames - 1 else f"{entry_id}:{index + 1}"


def sse_comment(text: str) -> str:
    """A comment line with no blank line after it. The `openai` client's SSE decoder never forgets the last event id,
    so once a frame carried one, a blank line after a comment is an event to it, with empty data, which it then fails
    to parse as JSON: a keep-alive in the middle of a stream ended the client's stream with JSONDecodeError."""
    return f": {text}\n"


def sse_frame(data: str, event_id: str | None = None, retry_ms: int | None = None) -> str:
    prefix = f"id: {event_id}\n" if event_id else ""
    if retry_ms is not None:
        prefix = f"retry: {retry_ms}\n{prefix}"
    return f"{prefix}data: {data}\n\n"


def resumable_response(frames: Iterator[str], attachment: StreamAttachment) -> Response:
    """`sse_response` for a relay that holds `attachment` (`tasks.streams.attachments.attach`): it renews the lease as
    frames go out and detaches when the relay ends, however it ends. A client that drops leaves the request running
    for `stream_resume_grace_s`, to resume with Last-Event-ID; after that, with nobody reading, a reaper cancels it."""

    def held() -> Iterator[str]:
        try:
            for frame in frames:
                attachment.renew_if_due()
                yield frame
        finally:
            attachment.detach()

    return sse_response(held())


def sse_response(frames: Iterator[str]) -> Response:
    response = Response(stream_with_context(frames), mimetype="text/event-stream")
    response.headers["Cache-Control"] = "no-cache"
    response.headers["X-Accel-Buffering"] = "no"
    return response
