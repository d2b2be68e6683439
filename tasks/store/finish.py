"""The one way a request ends: its result in SQL, then its final stream event, both only once."""

from __future__ import annotations

from typing import Any

import redis
from sqlalchemy import select
from sqlalchemy.orm import Session

from tasks.config import Config
from tasks.messages.generation import ErrorInfo, EventType, FinishReason, StreamEvent, Usage, UsageDetails
from tasks.store.models import RequestRecord, ResultRecord
from tasks.store.request_store import cancel_if_queued, record_result
from tasks.streams.cancel_flags import request_cancel
from tasks.streams.events import append_final_once

# A result the database refused to store (a value its columns cannot hold): the request or batch line still ends once.
RESULT_NOT_RECORDED = ErrorInfo("The result could not be recorded.", "server_error", code="result_not_recorded")


def finish_request(
    session: Session,
    client: redis.Redis,
    config: Config,
    request_id: str,
    *,
    text: str = "",
    completion_tokens: int = 0,
    finish_reason: FinishReason | None = None,
    error: ErrorInfo | None = None,
    logprobs: list[dict[str, Any]] | None = None,
    prompt_logprobs: list[dict[str, Any] | None] | None = None,
    extra_choices: list[dict[str, Any]] | None = None,
    steering: dict[str, Any] | None = None,
    monitor: dict[str, Any] | None = None,
    usage_details: UsageDetails | None = None,
) -> bool:
    """True if this call ended the request; False, streaming nothing, if another writer already had.

    SQL first, so whoever sees the final event can read the result; only the writer of the one result streams
    the final event, and only onto a stream that does not already end in one (a reader may have written it from
    the result, tasks/reapers/orphans.py), so a stream never carries two."""
    recorded = record_result(
        session,
        request_id,
        text=text,
        completion_tokens=completion_tokens,
        finish_reason=finish_reason,
        error=error,
        logprobs=logprobs,
        prompt_logprobs=prompt_logprobs,
        extra_choices=extra_choices,
        steering=steering,
        monitor=monitor,
        usage_details=usage_details.to_dict() if usage_details else None,
    )
    if recorded:
        append_final_once(client, config, request_id, final_event(session, request_id))
    return recorded


def end_stream_if_finished(session: Session, client: redis.Redis, config: Config, request_id: str) -> bool:
    """Gives a request finished in SQL the final stream event it lacks (the XADD after its result was lost, as when
    Redis crashed between the two), so its readers end; True if this call wrote it."""
    if session.get(ResultRecord, request_id) is None:
        return False
    return append_final_once(client, config, request_id, final_event(session, request_id)) is not None


def final_event(session: Session, request_id: str) -> StreamEvent:
    """The FINAL stream event of a request whose result is stored: what that result says."""
    result = session.get(ResultRecord, request_id)
    prompt_tokens = session.scalar(select(RequestRecord.prompt_tokens).where(RequestRecord.id == request_id))
    assert result is not None and prompt_tokens is not None
    return final_event_of(
        prompt_tokens,
        result.completion_tokens,
        FinishReason(result.finish_reason) if result.finish_reason else None,
        ErrorInfo.from_dict(result.error) if result.error else None,
        UsageDetails.from_dict(result.usage_details),
        result.steering,
        result.monitor,
    )


def final_event_of(
    prompt_tokens: int,
    completion_tokens: int,
    finish_reason: FinishReason | None,
    error: ErrorInfo | None,
    usage_details: UsageDetails,
    steering: dict[str, Any] | None,
    monitor: dict[str, Any] | None,
) -> StreamEvent:
    """The FINAL event of a result: as stored (`final_event`), or as its writer has it in hand."""
    return StreamEvent(
        EventType.FINAL,
        finish_reason=finish_reason,
        usage=Usage(prompt_tokens, completion_tokens, usage_details),
        error=error,
        steering=steering,
        monitor=monitor,
    )


def cancel_request(session: Session, client: redis.Redis, config: Config, request_id: str) -> None:
    """Stop a request wherever it is: a running one through its cancel flag, a queued one right here."""
    request_cancel(client, config, request_id)
    if cancel_if_queued(session, request_id):
        finish_request(session, client, config, request_id, finish_reason=FinishReason.ABORT)
