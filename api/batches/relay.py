"""A batch's progress stream as Server-Sent Events, resumable by stream entry id, ending with the batch."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator

import redis

from api.streaming.sse import sse_comment, sse_frame
from tasks.batches.messages import BatchEvent, BatchEventType
from tasks.batches.models import TERMINAL_BATCH_STATUSES, BatchStatus
from tasks.messages.generation import ErrorInfo
from tasks.streams.events import read_json

logger = logging.getLogger(__name__)


def batch_frames(
    client: redis.Redis, key: str, after_id: str, *, heartbeat_s: float, final_event: Callable[[], BatchEvent | None]
) -> Iterator[str]:
    """Events after `after_id` until the batch ends, then [DONE]; on a quiet stream, `final_event` (from SQL) ends
    it if the batch finished while its terminal event was missed (expired stream, Redis hiccup)."""
    try:
        for item in read_json(client, key, after_id, int(heartbeat_s * 1000)):
            if item is None:
                final = final_event()
                if final is not None:
                    yield sse_frame(json.dumps(final.to_dict()))
                    yield sse_frame("[DONE]")
                    return
                yield sse_comment("keep-alive")
                continue
            entry_id, data = item
            yield sse_frame(json.dumps(data), entry_id)
            if is_final(BatchEvent.from_dict(data)):
                yield sse_frame("[DONE]")
                return
    except redis.exceptions.RedisError as exc:
        logger.warning("batch stream %s broke off: %s", key, exc)
        error = ErrorInfo("The event stream was interrupted; reconnect with Last-Event-ID.", "service_unavailable")
        yield sse_frame(json.dumps({"error": error.to_dict()}))


def is_final(event: BatchEvent) -> bool:
    return event.type == BatchEventType.STATUS and BatchStatus(event.status) in TERMINAL_BATCH_STATUSES
