"""A request's Redis stream read from its start and translated into another API's typed events (the Responses API's,
Anthropic's Messages API's), through the stream hub (tasks/streams/events.py follow_events)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import redis

from api.services import services
from tasks.messages.generation import ErrorInfo, StreamEvent
from tasks.reapers.orphans import settle_quiet_request
from tasks.streams.events import STREAM_START, DeadlinePassed, follow_events
from tasks.streams.redis_keys import RedisKeys

logger = logging.getLogger(__name__)
TIMED_OUT = ErrorInfo("The request timed out.", "timeout", None, "timeout")


class EventTranslator(Protocol):
    def translate(self, event: StreamEvent) -> list[dict[str, Any]]: ...

    def error(self, info: ErrorInfo) -> list[dict[str, Any]]: ...


def translated_events(
    request_id: str, translator: EventTranslator, on_timeout: Callable[[], None], interrupted: ErrorInfo
) -> Iterator[list[dict[str, Any]] | None]:
    """Each stream entry's typed events, in order, through the final one; None whenever the heartbeat passes quietly
    (a quiet stream checks its worker is alive). A stream past the request timeout (after `on_timeout`) or broken
    off ends with the translator's error events (`interrupted`'s when Redis failed)."""
    svc = services()
    key = RedisKeys(svc.config.redis_prefix).request_stream(request_id)
    try:
        for item in follow_events(
            svc.streams.read_json,
            key,
            STREAM_START,
            idle_s=svc.config.sse_heartbeat_s,
            timeout_s=svc.config.request_timeout_s,
            on_idle=lambda: settle_quiet_request(svc.sessions, svc.redis, svc.config, request_id),
        ):
            yield None if item is None else translator.translate(item[1])
    except DeadlinePassed:
        on_timeout()
        yield translator.error(TIMED_OUT)
    except redis.exceptions.RedisError as exc:
        logger.warning("stream of %s broke off: %s", request_id, exc)
        yield translator.error(interrupted)
