"""When a model proposer pays, and how many tokens it proposes.

A proposer's pass holds up the whole step, so the number of passes is the step's choice: the k that gives the most
expected tokens per second for every running row, from each speculating row's acceptance rate (Leviathan et al.'s
expected tokens per step) and the measured seconds of a plain step, of a proposer pass, and of each proposed token
the step verifies, timed over steps that only decode. Within those k passes each row proposes no more than its own
rate pays for in verification alone: a row whose proposals are mostly rejected proposes none. When no k pays, the
proposer is off, but proposes one token now and then so the rates it decides by stay current: after PROBE_INTERVAL
steps, then after twice as many each time the probe did not pay, up to MAX_PROBE_INTERVAL. While it is on, it stays
out of one step in PROBE_INTERVAL so that the plain step's time stays current too.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

PROBE_INTERVAL = 16
MAX_PROBE_INTERVAL = 256
TIMING_DECAY = 0.9  # weight of the past in running means of seconds
PRIOR_DECAY = 0.7  # weight of the past in a proposer's acceptance rate over all requests
MIN_GAIN = 1.05  # a proposal must promise this much more than none: the cost model is only an estimate
AGING = 0.9  # per step without proposals, a request's rate moves this much less than all the way to the prior


def running_mean(mean: float | None, value: float, decay: float) -> float:
    """An exponential running mean that takes its first value whole (None: nothing measured yet)."""
    return value if mean is None else decay * mean + (1 - decay) * value


def expected_tokens(rate: float, num_proposed: int) -> float:
    """Tokens a verifying step yields for `num_proposed` proposals accepted independently at `rate`."""
    return num_proposed + 1 if rate >= 1 else (1 - rate ** (num_proposed + 1)) / (1 - rate)


@dataclass(frozen=True)
class StepCost:
    plain_s: float | None  # a step of this many rows that verifies nothing; None: unmeasured, proposals look free
    pass_s: float | None  # one pass of the proposer; None: unmeasured
    verify_token_s: float | None  # each proposed token the step verifies on top of a plain step; None: unmeasured


def most_rewarding_length(
    rates: Sequence[float], limits: Sequence[int], num_rows: int, cost: StepCost, min_gain: float = MIN_GAIN
) -> int:
    """k in 0..max(limits) giving the most expected tokens per second over the step's `num_rows` rows, of which
    row i (rate, limit) proposes min(k, limit) tokens; 0 when no proposal promises `min_gain` x what none does."""

    def tokens_per_second(k: int) -> float:
        proposed = [min(k, limit) for limit in limits]
        tokens = num_rows + sum(expected_tokens(rate, n) - 1 for rate, n in zip(rates, proposed, strict=True))
        if cost.plain_s is None:
            return tokens
        seconds = cost.plain_s + k * (cost.pass_s or 0.0) + sum(proposed) * (cost.verify_token_s or 0.0)
        return tokens / seconds

    best = max(range(max(limits, default=0) + 1), key=tokens_per_second)
    return best if tokens_per_second(best) >= min_gain * tokens_per_second(0) else 0


def own_limits(rates: Sequence[float], limits: Sequence[int], num_rows: int, cost: StepCost) -> list[int]:
    """Each row's most rewarding length if the passes were free (another row pays for them), capped by its limit.
    The margin applies to the step as a whole only: one row's share of a large batch never reaches it."""
    verification_only = StepCost(cost.plain_s, 0.0, cost.verify_token_s)
    return [
        most_rewarding_length([rate], [limit], num_rows, verification_only, min_gain=1.0)
        for rate, limit in zip(rates, limits, strict=True)
    ]


class StepTimer:
    """Running means of the engine's plain decode steps, by number of rows, and of what each verified proposal adds
    to a step of as many rows. Steps that prefill are left out: their time says nothing about what a proposal costs."""

    def __init__(self) -> None:
        self._plain_s: dict[int, float] = {}
        self.verify_token_s: float | None = None

    def plain_s(self, num_rows: int) -> float | None:
        return self._plain_s.get(num_rows)

    def record(self, seconds: float, num_rows: int, num_proposed_tokens: int, is_decode_only: bool) -> None:
        if not is_decode_only:
            return
        plain_s = self._plain_s.get(num_rows)
        if num_proposed_tokens == 0:
            self._plain_s[num_rows] = running_mean(plain_s, seconds, TIMING_DECAY)
        elif plain_s is not None:
            extra = max(seconds - plain_s, 0.0) / num_proposed_tokens
            self.verify_token_s = running_mean(self.verify_token_s, extra, TIMING_DECAY)


class DraftPolicy:
    """One model proposer's choice of lengths for a step's rows, and its acceptance rate over all requests (the
    starting rate of a request it has not proposed for yet)."""

    def __init__(self) -> None:
        self.prior_rate = 1.0  # optimistic until measured
        self._num_idle_steps = 0
        self._probe_interval = PROBE_INTERVAL
        self._num_active_steps = 0
        self._num_untimed_steps = 0

    def lengths(self, rates: Sequence[float], limits: Sequence[int], num_rows: int, cost: StepCost) -> list[int]:
        """How many tokens each row (rate, limit) proposes in a step of `num_rows` rows."""
        caps = own_limits(rates, limits, num_rows, cost)
        num_passes = self._num_passes(rates, caps, num_rows, cost)
        if num_passes == 1 and not any(caps):  # a probe: every row, to re-measure every rate
            caps = [min(limit, 1) for limit in limits]
        return [min(num_passes, cap) for cap in caps]

    def _num_passes(self, rates: Sequence[float], caps: Sequence[int], num_rows: int, cost: StepCost) -> int:
        if cost.plain_s is None and self._num_untimed_steps < PROBE_INTERVAL:
            self._num_untimed_steps += 1  # wait for a plain step to be timed, unless other proposals never let one be
            return 0
        if cost.plain_s is not None:
            self._num_untimed_steps = 0
        num_passes = most_rewarding_length(rates, caps, num_rows, cost)
        if num_passes == 0:
            self._num_active_steps = 0
            self._num_idle_steps += 1
            if self._num_idle_steps < self._probe_interval:
                return 0
            self._num_idle_steps = 0
            self._probe_interval = min(2 * self._probe_interval, MAX_PROBE_INTERVAL)
            return 1
        self._num_idle_steps = 0
        self._probe_interval = PROBE_INTERVAL
        self._num_active_steps += 1
        if self._num_active_steps > PROBE_INTERVAL:
            self._num_active_steps = 0
            return 0
        return num_passes

    def aged(self, rate: float) -> float:
        """A request's rate after a step in which it proposed nothing: nearer the proposer's rate over all requests,
        so that one bad streak does not keep a request off for the rest of its life."""
        return AGING * rate + (1 - AGING) * self.prior_rate

    def record(self, num_proposed: int, num_accepted: int) -> None:
        self.prior_rate = PRIOR_DECAY * self.prior_rate + (1 - PRIOR_DECAY) * num_accepted / num_proposed
