"""How many generation requests one api process admits at once, how long one may wait for its turn, and when a
refused one should come back.

Admitting a request (authenticate, parse, validate, tokenize, record, enqueue) is CPU work on the api's one event
loop, a few milliseconds each. A burst of a thousand at once used to run all of them on that loop and on the SQL
pool together, so whatever arrived during it (`/health` included) waited behind the whole burst. Now a generation
request first takes one of ADMISSION_SLOTS slots, before anything else is done for it, and the rest of a burst waits
for its turn in line, costing nothing while it waits, as vLLM queues every request it is sent: a burst the process
can admit within ADMISSION_WAIT_S is served, however it arrived, with no error for the client to retry.

A request is refused with 429 `server_busy` only when its turn would not come within ADMISSION_WAIT_S: at once, when
the line ahead of it would take longer than that to drain at the rate this process admits (slots over the running
mean of slot hold times), or after waiting that long when admissions ran slower than measured. Its retry hints,
`retry-after-ms` (which the `openai` client reads first) and `Retry-After` in whole seconds, tell it to come back
when the line ahead of it will have drained, and each refusal one admission later than the one before, so a burst
refused together comes back spread out at the rate it can be admitted, and waits in line again if it still must.

The slot is given back as soon as the request is enqueued (a stream then only relays) or its view ends, whichever
comes first.
"""

from __future__ import annotations

import threading
import time

FIRST_HOLD_S = 0.05  # a slot's hold time assumed before any admission was timed
HOLD_TIME_WEIGHT = 0.1  # of each new admission in the running mean of hold times
# The longest retry hint: the `openai` client ignores one over 60 s (before 1.x) or 120 s, and gives up instead.
MAX_RETRY_AFTER_S = 60.0


class AdmissionGate:
    """At most `slots` admissions at once in this process; a caller waits in line at most `wait_s` for one
    (threading's primitives are gevent's under the gunicorn gevent worker, so waiting greenlets cost nothing)."""

    def __init__(self, slots: int, wait_s: float) -> None:
        self._slots = threading.BoundedSemaphore(slots) if slots > 0 else None
        self._num_slots = max(slots, 1)
        self.wait_s = wait_s
        self._lock = threading.Lock()
        self._mean_hold_s = FIRST_HOLD_S
        self._num_waiting = 0  # callers in line for a slot
        self._num_held = 0  # slots taken
        self._next_retry_at = 0.0  # monotonic: when the last refused request was told to come back

    def acquire(self) -> float | None:
        """The monotonic time the slot was taken, or None when the caller's turn would not come within `wait_s`:
        refused at once when the line ahead of it would take longer to drain, else after waiting `wait_s`."""
        if self._slots is None:
            return time.monotonic()
        with self._lock:
            num_ahead = self._num_ahead()
            if num_ahead * self._admission_interval_s() > self.wait_s:
                return None
            self._num_waiting += 1
        is_acquired = False
        try:
            is_acquired = self._slots.acquire(timeout=self.wait_s)
        finally:
            with self._lock:
                self._num_waiting -= 1
                if is_acquired:
                    self._num_held += 1
                else:  # fewer than `num_ahead` admissions in wait_s: they are slower than measured
                    self._mean_hold_s = max(self._mean_hold_s, self.wait_s * self._num_slots / max(num_ahead, 1))
        return time.monotonic() if is_acquired else None

    def release(self, acquired_at: float) -> None:
        held_s = time.monotonic() - acquired_at
        with self._lock:
            self._mean_hold_s += HOLD_TIME_WEIGHT * (held_s - self._mean_hold_s)
            if self._slots is not None:
                self._num_held -= 1
        if self._slots is not None:
            self._slots.release()

    def retry_after_s(self) -> float:
        """When a request refused now should come back: once the line now waiting has drained, one admission after
        the previous refused request, at the rate this process admits; at most MAX_RETRY_AFTER_S."""
        now = time.monotonic()
        with self._lock:
            interval_s = self._admission_interval_s()
            drained_at = now + max(self._num_ahead(), 1) * interval_s
            self._next_retry_at = max(self._next_retry_at + interval_s, drained_at)
            return min(self._next_retry_at - now, MAX_RETRY_AFTER_S)

    def _num_ahead(self) -> int:
        """Admissions that must end before a caller arriving now gets a slot: those in line, and one, when every slot
        is taken; none while a slot is free and nobody waits."""
        return max(self._num_waiting + self._num_held - self._num_slots + 1, 0)

    def _admission_interval_s(self) -> float:
        """The time between admissions when every slot is busy: the running mean of hold times over the slots."""
        return self._mean_hold_s / self._num_slots
