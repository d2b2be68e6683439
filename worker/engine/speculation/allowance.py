"""Which rows may speculate, and how far: the engine's per-request side of `worker.engine.speculation.speculator`."""

from __future__ import annotations

from collections.abc import Collection

from scheduler.request import Request
from tasks.config import Config
from worker.engine.sequence import EngineSequence
from worker.engine.speculation.speculator import Allowance


def can_speculate(sequence: EngineSequence, request: Request, is_worker_monitored: bool) -> bool:
    """Rows whose verified tokens are what plain decoding would produce (greedy) or are distributed as it would
    draw them (unseeded sampling), and that change no steered or monitored activations: while the worker-wide
    monitor runs, every row is monitored, and rejected proposals must not enter its statistics. A row constrained
    by a grammar never speculates: proposals are not checked against its matcher, which only moves forward."""
    if sequence.grammar is not None:
        return False
    sampling = sequence.request.sampling
    # A seeded row's draws must not depend on the batch, which decides whether it speculates.
    is_sampled_safely = sampling.is_greedy or sampling.seed is None
    # verification reads the raw logits: penalties and biases would make it keep what plain decoding would not pick
    is_plain = is_sampled_safely and not (sampling.has_penalties or sampling.logit_bias) and sampling.logprobs is None
    is_unobserved = sequence.sae is None and not is_worker_monitored
    return is_plain and is_unobserved and request.num_output_tokens >= sampling.min_tokens


def speculation_allowance(
    sequence: EngineSequence, request: Request, config: Config, methods: Collection[str], is_worker_monitored: bool
) -> Allowance:
    """The request's own speculative settings, else the worker's; 0 tokens for rows that must not speculate."""
    sampling = sequence.request.sampling
    method = sampling.speculative_method or config.speculative_method
    if method not in methods or not can_speculate(sequence, request, is_worker_monitored):
        return Allowance(method, 0)
    num_tokens = sampling.num_speculative_tokens or config.num_speculative_tokens
    return Allowance(method, min(num_tokens, sampling.max_tokens - request.num_output_tokens - 1))
