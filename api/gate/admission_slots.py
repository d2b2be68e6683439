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

import threading
import time

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
