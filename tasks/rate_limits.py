"""Per-key request and token budgets in fixed one-minute windows, counted in Redis so every api process shares them.

A request is charged when it is admitted; one that a budget refuses is not charged, so a client that retries after
`reset_s` gets in. Counters live two windows and then expire."""

from __future__ import annotations

import time
from dataclasses import dataclass

import redis

from tasks.config import Config

WINDOW_S = 60


@dataclass(frozen=True)
class Budget:
    """One limit's state after a request: what OpenAI's x-ratelimit-* headers report."""

    limit: int
    remaining: int
    reset_s: float  # until the window turns over

    @property
    def is_exceeded(self) -> bool:
        return self.remaining < 0


@dataclass(frozen=True)
class RateDecision:
    requests: Budget | None  # None: no request limit
    tokens: Budget | None

    @property
    def is_allowed(self) -> bool:
        return not any(budget is not None and budget.is_exceeded for budget in (self.requests, self.tokens))


def charge(client: redis.Redis, config: Config, key_name: str, num_tokens: int) -> RateDecision:
    """Counts one request of `num_tokens` against `key_name`'s window, or nothing if a limit refuses it."""
    if not config.rate_limit_rpm and not config.rate_limit_tpm:
        return RateDecision(None, None)
    now = time.time()
    window = int(now // WINDOW_S)
    request_key = f"{config.redis_prefix}rate:{key_name}:{window}:requests"
    token_key = f"{config.redis_prefix}rate:{key_name}:{window}:tokens"
    with client.pipeline(transaction=True) as pipe:
        pipe.incr(request_key).incrby(token_key, num_tokens)
        pipe.expire(request_key, 2 * WINDOW_S).expire(token_key, 2 * WINDOW_S)
        num_requests, num_window_tokens, *_ = pipe.execute()
    reset_s = WINDOW_S - now % WINDOW_S
    requests = _budget(config.rate_limit_rpm, num_requests, reset_s)
    decision = RateDecision(requests, _budget(config.rate_limit_tpm, num_window_tokens, reset_s))
    if not decision.is_allowed:
        with client.pipeline(transaction=True) as pipe:
            pipe.decr(request_key).decrby(token_key, num_tokens).execute()
    return decision


def _budget(limit: int, used: int, reset_s: float) -> Budget | None:
    return Budget(limit, limit - used, reset_s) if limit else None
