"""Many requests ended at once, as a worker's requests of one burst end together: their results in one transaction,
then their final events in one Redis round trip, with what `finish_request` promises each (its result once, in SQL
before its final event; none streamed by a call that did not record it).

A request's own `finish_request` is an INSERT, an UPDATE, a commit, two SELECTs to build its FINAL event from the row
just written, and a Redis call. Thirty-two of them at once on SQLite queued for its write lock, which a waiter polls
(sleeping 1 ms, then 2, 5, 10 ... up to 100 ms between tries), so the last of a round's streams ended up to 270 ms
after the engine's last token (docs/perf-notes.md); here they are one commit, and their FINAL events are built from
the values in hand.
"""

from __future__ import annotations

import dataclasses
import logging
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import redis
from sqlalchemy import Table, insert, select, update
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

from tasks.config import Config
from tasks.messages.generation import ErrorInfo, FinishReason, StreamEvent, UsageDetails
from tasks.store.db import SessionFactory
from tasks.store.finish import final_event_of
from tasks.store.models import RequestStatus, ResultRecord
from tasks.store.request_store import REQUESTS, final_status, store_result_row
from tasks.streams.events import append_finals_once

logger = logging.getLogger(__name__)
RESULTS: Table = ResultRecord.__table__  # type: ignore[assignment]


@dataclass(frozen=True)
class RequestResult:
    """A request's one result as its worker has it, with its prompt's token count (the FINAL event's usage)."""

    request_id: str
    prompt_tokens: int
    text: str = ""
    completion_tokens: int = 0
    finish_reason: FinishReason | None = None
    error: ErrorInfo | None = None
    logprobs: list[dict[str, Any]] | None = None
    prompt_logprobs: list[dict[str, Any] | None] | None = None
    extra_choices: list[dict[str, Any]] | None = None
    steering: dict[str, Any] | None = None
    monitor: dict[str, Any] | None = None
    usage_details: UsageDetails = dataclasses.field(default_factory=UsageDetails)

    @property
    def status(self) -> RequestStatus:
        return final_status(self.finish_reason, self.error)

    def final_event(self) -> StreamEvent:
        return final_event_of(
            self.prompt_tokens,
            self.completion_tokens,
            self.finish_reason,
            self.error,
            self.usage_details,
            self.steering,
            self.monitor,
        )

    def row(self, finished_at: datetime) -> ResultRecord:
        return ResultRecord(**self.row_values(finished_at))

    def row_values(self, finished_at: datetime) -> dict[str, Any]:
        return dict(
            request_id=self.request_id,
            text=self.text,
            finish_reason=self.finish_reason.value if self.finish_reason else None,
            completion_tokens=self.completion_tokens,
            error=self.error.to_dict() if self.error else None,
            logprobs=self.logprobs,
            prompt_logprobs=self.prompt_logprobs,
            extra_choices=self.extra_choices,
            steering=self.steering,
            monitor=self.monitor,
            usage_details=self.usage_details.to_dict(),
            finished_at=finished_at,
        )


# One outcome per result: True (recorded, its FINAL event written), False (another writer had recorded one), or the
# exception that kept it from being recorded (a value the database refuses: that request's own)
Outcome = bool | Exception


def finish_requests(
    sessions: SessionFactory, client: redis.Redis, config: Config, results: Sequence[RequestResult]
) -> list[Outcome]:
    """`finish_request` for each of `results` (distinct requests), together. If their one transaction fails, each is
    recorded on its own, so a row the database refuses fails its own request only. A Redis failure raises, after the
    results are recorded (as `finish_request`'s does): their streams are ended by whoever finds them finished."""
    try:
        with sessions() as session:
            outcomes: list[Outcome] = list(record_results(session, results))
    except SQLAlchemyError as exc:
        logger.warning("recording %d results at once failed (%s); recording each on its own", len(results), exc)
        outcomes = [_record_alone(sessions, result) for result in results]
    recorded = [result for result, outcome in zip(results, outcomes, strict=True) if outcome is True]
    append_finals_once(client, config, [(result.request_id, result.final_event()) for result in recorded])
    return outcomes


def record_results(session: Session, results: Sequence[RequestResult]) -> list[bool]:
    """Every result not already recorded, in one transaction; False for those another writer had. Raises, having
    rolled back, if the database refuses any of them."""
    ids = [result.request_id for result in results]
    if len(set(ids)) != len(ids):
        raise ValueError("one result per request")
    existing = set(session.scalars(select(ResultRecord.request_id).where(ResultRecord.request_id.in_(ids))))
    fresh = [result for result in results if result.request_id not in existing]
    finished_at = datetime.now(timezone.utc)
    # statements on the tables, not the mapped classes: the ORM's unit of work and bulk-update path cost the worker
    # more CPU than the statements themselves, for objects nothing reads back
    if fresh:
        session.execute(insert(RESULTS), [result.row_values(finished_at) for result in fresh])
    by_status: dict[RequestStatus, list[str]] = defaultdict(list)
    for result in fresh:
        by_status[result.status].append(result.request_id)
    for status, status_ids in by_status.items():
        session.execute(update(REQUESTS).where(REQUESTS.c.id.in_(status_ids)).values(status=status.value))
    try:
        session.commit()
    except SQLAlchemyError:
        session.rollback()
        raise
    return [request_id not in existing for request_id in ids]


def _record_alone(sessions: SessionFactory, result: RequestResult) -> Outcome:
    try:
        with sessions() as session:
            return store_result_row(session, result.row(datetime.now(timezone.utc)), result.status)
    except Exception as exc:  # this request's own failure, for its caller to handle
        return exc
