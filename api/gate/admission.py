"""Whether a new generation request may join its model's queue: a live worker of that model to run it, room in that
model's queue, and the calling key's rate limits. A refusal is a 503 or 429 with Retry-After in OpenAI's shape,
before anything is recorded; an admitted request carries the key's x-ratelimit-* headers, as OpenAI's responses do."""

from __future__ import annotations

import math

import redis
from flask import g
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from api.errors import APIError
from api.observability.api_metrics import count_rejection
from tasks.config import Config
from tasks.rate_limits import Budget, RateDecision, charge
from tasks.store.models import RequestRecord, RequestStatus
from tasks.streams.worker_leases import count_live_workers

NO_WORKER_RETRY_AFTER_S = 5  # a supervisor restarts a dead worker within seconds; loading a model takes longer
QUEUE_FULL_RETRY_AFTER_S = 1


def admit(session: Session, client: redis.Redis, config: Config, model: str, key_name: str, num_tokens: int) -> None:
    """Raises the refusal (counted in /metrics by its code), or charges the key and leaves its headers in
    `g.rate_limit_headers`."""
    try:
        _admit(session, client, config, model, key_name, num_tokens)
    except APIError as refusal:
        count_rejection(model, refusal.info.code)
        raise


def _admit(session: Session, client: redis.Redis, config: Config, model: str, key_name: str, num_tokens: int) -> None:
    num_workers, num_queued = _workers_and_queue(client, config, model)
    if num_workers == 0:
        raise APIError(
            503,
            f"No worker serving {model} is running; retry shortly.",
            type="service_unavailable",
            code="no_worker_available",
            headers={"Retry-After": str(NO_WORKER_RETRY_AFTER_S)},
        )
    _check_queue_room(session, config, model, num_queued)
    decision = charge(client, config, key_name, num_tokens)
    headers = rate_limit_headers(decision)
    if not decision.is_allowed:
        exceeded = [b for b in (decision.requests, decision.tokens) if b is not None and b.is_exceeded]
        retry_after = str(math.ceil(max(budget.reset_s for budget in exceeded)))
        what = "requests" if decision.requests in exceeded else "tokens"
        raise APIError(
            429,
            f"Rate limit reached for {what} per minute on this key; retry after {retry_after} s.",
            type="rate_limit_exceeded",
            code="rate_limit_exceeded",
            headers={**headers, "Retry-After": retry_after},
        )
    g.rate_limit_headers = headers


def _workers_and_queue(client: redis.Redis, config: Config, model: str) -> tuple[int, int]:
    """The model's live workers and the tasks waiting on its interactive queue, in one round trip: the first thing
    admission asks Redis, so a Redis that is down is a 503 before anything is written."""
    with client.pipeline(transaction=False) as pipe:
        count_live_workers(pipe, config, model)
        pipe.llen(config.interactive_queue_of(model))  # Celery's Redis transport keeps a queue's tasks in one list
        num_workers, num_queued = pipe.execute()
    return int(num_workers), int(num_queued)


def _check_queue_room(session: Session, config: Config, model: str, num_queued: int) -> None:
    """Requests waiting are counted on the queue itself, with the live workers; only a cap on the tokens waiting
    reads their rows (a query and a commit more before the request's own INSERT)."""
    num_tokens = _queued_prompt_tokens(session, model) if config.max_queued_tokens else 0
    is_full = (config.max_queued_requests and num_queued >= config.max_queued_requests) or (
        config.max_queued_tokens and num_tokens >= config.max_queued_tokens
    )
    if is_full:
        raise APIError(
            429,
            f"The queue for {model} is full ({num_queued} requests waiting); retry shortly.",
            type="rate_limit_exceeded",
            code="queue_full",
            headers={"Retry-After": str(QUEUE_FULL_RETRY_AFTER_S)},
        )


def _queued_prompt_tokens(session: Session, model: str) -> int:
    queued = select(func.coalesce(func.sum(RequestRecord.prompt_tokens), 0)).where(
        RequestRecord.status == RequestStatus.QUEUED.value, RequestRecord.model == model
    )
    num_tokens = session.execute(queued).scalar_one()
    session.commit()  # ends the read's transaction: the request's own INSERT follows in a new one
    return int(num_tokens)


def rate_limit_headers(decision: RateDecision) -> dict[str, str]:
    headers: dict[str, str] = {}
    for name, budget in (("requests", decision.requests), ("tokens", decision.tokens)):
        if budget is not None:
            headers.update(_budget_headers(name, budget))
    return headers


def _budget_headers(name: str, budget: Budget) -> dict[str, str]:
    return {
        f"x-ratelimit-limit-{name}": str(budget.limit),
        f"x-ratelimit-remaining-{name}": str(max(budget.remaining, 0)),
        f"x-ratelimit-reset-{name}": f"{math.ceil(budget.reset_s)}s",
    }
