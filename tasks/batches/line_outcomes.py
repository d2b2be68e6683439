"""A batch line's one result, and recording the results of the lines a chunk finished together: one conditional
UPDATE per line, so only the worker still holding a line's lease records it."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import bindparam, update
from sqlalchemy.exc import DataError
from sqlalchemy.orm import Session

from tasks.batches.models import BatchLine, LineStatus
from tasks.store.finish import RESULT_NOT_RECORDED


@dataclass(frozen=True)
class LineOutcome:
    """A running line's one result; each field is the batch_lines column of the same name."""

    status: LineStatus
    text: str = ""
    finish_reason: str | None = None
    completion_tokens: int = 0
    error: dict[str, Any] | None = None
    logprobs: list[dict[str, Any]] | None = None  # when the line asked for them
    steering: dict[str, Any] | None = None  # the steering that ran, as a request's result reports it
    monitor: dict[str, Any] | None = None  # the monitored positions, when the line asked for them
    extra_choices: list[dict[str, Any]] | None = None  # n > 1: choices 1.., as ChoiceResult dicts
    prompt_logprobs: list[dict[str, Any] | None] | None = None  # choice 0's vLLM prompt_logprobs, when asked for


_OUTCOME_COLUMNS = tuple(field.name for field in dataclasses.fields(LineOutcome))
# Built once, on the table rather than the ORM class: an ORM UPDATE built per line cost 0.5 ms of the worker's
# Python (construction, cache key, session synchronization), time taken from the engine thread under the GIL.
_LINES = BatchLine.__table__
_FINISH_LINE = (
    update(_LINES)
    .where(
        _LINES.c.id == bindparam("line_id"),
        _LINES.c.status == LineStatus.RUNNING.value,
        _LINES.c.lease_owner == bindparam("owner"),
    )
    .values({name: bindparam(name) for name in (*_OUTCOME_COLUMNS, "finished_at")})
)


def finish_lines(
    session: Session,
    owner: str,
    outcomes: dict[int, LineOutcome],
    before_commit: Callable[[dict[int, LineStatus]], None] = lambda recorded: None,
) -> dict[int, LineStatus]:
    """Record running lines' one results (by line id) in one transaction of the session's own; returns the status
    recorded for each line recorded, leaving out those `owner` no longer holds (their lease lapsed and they moved
    on). A line whose result the database refuses (a value its columns cannot hold) is recorded as failed with
    `result_not_recorded`, so it still ends once and the lines finished beside it are recorded as they were.

    `before_commit` is called with the lines each commit records, in its transaction, before the commit: what the
    caller publishes of them there is in Redis before any other session can see them finished, so a batch's closer
    (which closes only once no line is open) publishes its final status after every line's event."""
    finished_at = time.time()
    rows = [_outcome_row(outcome, line_id, owner, finished_at) for line_id, outcome in outcomes.items()]
    try:
        is_every_line_held = bool(rows) and session.execute(_FINISH_LINE, rows).rowcount == len(rows)
    except DataError:
        is_every_line_held = False
    if is_every_line_held:  # the usual case, in one executemany
        recorded = {line_id: outcome.status for line_id, outcome in outcomes.items()}
        before_commit(recorded)
        session.commit()
    else:  # some line was taken, or refused: undo, and record line by line, each in its own transaction
        session.rollback()
        recorded = {}
        for row in rows:
            status = _finish_one(session, row, before_commit)
            if status is not None:
                recorded[row["line_id"]] = status
    session.expire_all()  # the UPDATE bypassed the ORM, so lines this session had loaded must load again
    return recorded


def _outcome_row(outcome: LineOutcome, line_id: int, owner: str, finished_at: float) -> dict[str, Any]:
    row = {name: getattr(outcome, name) for name in _OUTCOME_COLUMNS}
    row.update(status=outcome.status.value, finished_at=finished_at, line_id=line_id, owner=owner)
    return row


def _finish_one(
    session: Session, row: dict[str, Any], before_commit: Callable[[dict[int, LineStatus]], None]
) -> LineStatus | None:
    """One line's result, committed; its status, or None when `row`'s owner no longer holds the line."""
    try:
        is_held = session.execute(_FINISH_LINE, row).rowcount == 1
        return _commit_held(session, row["line_id"], LineStatus(row["status"]) if is_held else None, before_commit)
    except DataError:
        session.rollback()
    refused = LineOutcome(LineStatus.FAILED, error=RESULT_NOT_RECORDED.to_dict())
    failed = _outcome_row(refused, row["line_id"], row["owner"], row["finished_at"])
    is_held = session.execute(_FINISH_LINE, failed).rowcount == 1
    return _commit_held(session, row["line_id"], LineStatus.FAILED if is_held else None, before_commit)


def _commit_held(
    session: Session, line_id: int, status: LineStatus | None, before_commit: Callable[[dict[int, LineStatus]], None]
) -> LineStatus | None:
    if status is not None:
        before_commit({line_id: status})
    session.commit()
    return status
