"""The benchmark's requests, the same for every engine (seeded prompts, lengths, arrival times), and their feeder.

Prompts are random token ids rather than tokenized text: every engine generates exactly the requested number of
tokens (EOS is ignored), so the cost of a request depends only on its lengths, and random ids give exact,
seed-determined lengths without the tokenizer or a corpus. Special tokens (BOS, EOS, pad, ...) are never drawn.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass

ARRIVAL_SEED_OFFSET = 1  # arrival gaps come from their own stream, so they never change the prompts


@dataclass(frozen=True)
class BenchRequest:
    request_id: str
    prompt_token_ids: list[int]
    num_output_tokens: int
    arrival_s: float  # seconds after the workload starts


@dataclass(frozen=True)
class WorkloadSpec:
    num_requests: int
    prompt_len_range: tuple[int, int]  # inclusive
    output_len_range: tuple[int, int]  # inclusive
    seed: int


def make_workload(
    name: str,
    spec: WorkloadSpec,
    vocab_size: int,
    special_token_ids: Collection[int],
    poisson_rate_per_s: float | None,
) -> list[BenchRequest]:
    """The spec's requests, ids `<name>-<i>`; all at t=0 when `poisson_rate_per_s` is None, else a Poisson stream."""
    rng = random.Random(spec.seed)
    allowed_ids = [token_id for token_id in range(vocab_size) if token_id not in special_token_ids]
    arrivals = (
        [0.0] * spec.num_requests
        if poisson_rate_per_s is None
        else poisson_arrivals(spec.num_requests, poisson_rate_per_s, spec.seed + ARRIVAL_SEED_OFFSET)
    )
    requests = []
    for index, arrival_s in enumerate(arrivals):
        prompt_len = rng.randint(*spec.prompt_len_range)
        prompt = [rng.choice(allowed_ids) for _ in range(prompt_len)]
        requests.append(BenchRequest(f"{name}-{index}", prompt, rng.randint(*spec.output_len_range), arrival_s))
    return requests


def poisson_arrivals(num_requests: int, rate_per_s: float, seed: int) -> list[float]:
    """Arrival times with exponential gaps of mean 1/rate; the first request arrives at 0."""
    if rate_per_s <= 0:
        raise ValueError(f"the Poisson rate must be positive, got {rate_per_s}")
    rng = random.Random(seed)
    arrivals = [0.0]
    for _ in range(num_requests - 1):
        arrivals.append(arrivals[-1] + rng.expovariate(rate_per_s))
    return arrivals


def wait_until(deadline: float) -> None:
    """Sleeps until `time.perf_counter()` reaches `deadline`."""
    remaining = deadline - time.perf_counter()
    if remaining > 0:
        time.sleep(remaining)


class Feeder:
    """A thread that submits each request at its arrival time after `start`, in arrival order.

    Whoever waits for the outputs polls `check()`, so a failing submit ends the run instead of hanging it.
    """

    def __init__(self, requests: list[BenchRequest], start: float, submit: Callable[[BenchRequest], None]) -> None:
        self._requests = sorted(requests, key=lambda request: request.arrival_s)
        self._start = start
        self._submit = submit
        self._error: Exception | None = None
        self._thread = threading.Thread(target=self._feed, name="bench-feeder", daemon=True)
        self._thread.start()

    def check(self) -> None:
        if self._error is not None:
            raise RuntimeError("submitting a request failed") from self._error

    def join(self) -> None:
        self._thread.join()
        self.check()

    def _feed(self) -> None:
        try:
            for request in self._requests:
                wait_until(self._start + request.arrival_s)
                self._submit(request)
        except Exception as exc:
            self._error = exc
