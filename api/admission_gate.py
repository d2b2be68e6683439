"""How many generation requests one api process admits at once, how long one may wait for its turn, and when a
refused one should come back.

Admitting a request (authenticate, parse, validate, tokenize, record, enqueue) is CPU work on the api's one event
loop, a few milliseconds each. A burst of a thousand at once used to queue all of them on that loop and on the SQL
pool, so a new request waited behind the whole burst (5.5 s at 1,024). Now a generation request first takes one of
ADMISSION_SLOTS slots, before anything else is done for it; one that cannot get a slot within ADMISSION_WAIT_S is
refused with 429 `server_busy`, having cost almost nothing. The process admits as fast as it can and the rest of the
burst retries (the `openai` client does on its own).

The refusals carry staggered retry hints: `retry-after-ms` (which the `openai` client reads first) and `Retry-After`
in whole seconds, each refused request told to come back one admission-time later than the one before, at the rate
this process has been admitting. A burst refused all at once thus returns spread out, about once each, instead of
coming back together to be refused again.

The slot is given back as soon as the request is enqueued (a stream then only relays) or its view ends, whichever
comes first.
"""

from __future__ import annotations

import math
import threading
import time

from flask import Flask, g, request

from api.errors import APIError
from api.observability.api_metrics import count_rejection
from api.services import services

# The views that admit generation: each takes a slot before authentication, so a burst waits on the gate, not on
# the SQL pool that /health and every other route share.
GATED_ENDPOINTS = frozenset({"chat.create_chat_completion", "completions.create_completion", "responses.create"})
FIRST_HOLD_S = 0.05  # a slot's hold time assumed before any admission was timed
HOLD_TIME_WEIGHT = 0.1  # of each new admission in the running mean of hold times


class AdmissionGate:
    """At most `slots` admissions at once in this process; a caller waits at most `wait_s` for one (threading's
    primitives are gevent's under the gunicorn gevent worker, so waiting greenlets cost nothing while they wait)."""

    def __init__(self, slots: int, wait_s: float) -> None:
        self._slots = threading.BoundedSemaphore(slots) if slots > 0 else None
        self._num_slots = max(slots, 1)
        self.wait_s = wait_s
        self._lock = threading.Lock()
        self._mean_hold_s = FIRST_HOLD_S
        self._next_retry_at = 0.0  # monotonic: when the last refused request was told to come back

    def acquire(self) -> float | None:
        """The monotonic time the slot was taken, or None when none came free within `wait_s`."""
        if self._slots is not None and not self._slots.acquire(timeout=self.wait_s):
            return None
        return time.monotonic()

    def release(self, acquired_at: float) -> None:
        held_s = time.monotonic() - acquired_at
        with self._lock:
            self._mean_hold_s += HOLD_TIME_WEIGHT * (held_s - self._mean_hold_s)
        if self._slots is not None:
            self._slots.release()

    def retry_after_s(self) -> float:
        """When a request refused now should come back: one admission's time after the previous refused one, at the
        rate this process admits (slots / mean hold time), and no sooner than `wait_s` from now."""
        now = time.monotonic()
        with self._lock:
            spacing_s = self._mean_hold_s / self._num_slots
            self._next_retry_at = max(self._next_retry_at + spacing_s, now + self.wait_s)
            return self._next_retry_at - now


def register_admission_gate(app: Flask) -> None:
    """The services' gate as the app's first before_request hook (before authentication), and its slot given back
    when the request's context ends, for a request that did not give it back itself."""
    app.before_request_funcs.setdefault(None, []).insert(0, take_admission_slot)
    app.teardown_request(lambda _exc: release_admission_slot())


def take_admission_slot() -> None:
    if request.endpoint not in GATED_ENDPOINTS:
        return
    gate = services().admission_gate
    acquired_at = gate.acquire()
    if acquired_at is None:
        _drain_body()
        count_rejection(services().model_info.name, "server_busy")  # the body is not parsed: the default model
        retry_after_s = gate.retry_after_s()
        raise APIError(
            429,
            "This server is admitting as many requests as it can; retry after the time in Retry-After.",
            type="rate_limit_exceeded",
            code="server_busy",
            headers={"Retry-After": str(math.ceil(retry_after_s)), "retry-after-ms": str(round(retry_after_s * 1000))},
        )
    g.admission_slot = acquired_at


def release_admission_slot() -> None:
    """Gives this request's slot back, if it holds one: once it is enqueued, or when its view ends."""
    acquired_at = g.pop("admission_slot", None)
    if acquired_at is not None:
        services().admission_gate.release(acquired_at)


def _drain_body() -> None:
    """Reads a refused request's body (within the size limit) before answering: a socket closed with unread input
    is reset, and a reset can destroy the 429 before the client reads it."""
    if request.content_length is not None and request.content_length <= services().config.max_request_bytes:
        request.get_data(cache=False)
