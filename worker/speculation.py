"""Speculative decoding by prompt lookup: propose the tokens that followed the last occurrence of the request's
latest n-gram in its own prompt and output, verify them all in the next step's forward pass, and keep the longest
prefix the model agrees with (greedy) or that the rejection-sampling rule keeps (sampling), plus one token of the
model's own.

Only requests without penalties, logprobs, pending min_tokens, steering, monitoring or a seed speculate: for them
greedy output is exactly what plain decoding produces, and sampled output is distributed exactly as it would be.
Each request's number of proposed tokens adapts to how many it has had accepted, and nothing is proposed in steps
with more running requests than `spec_max_batch_size`, where the extra tokens would cost more than they save.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from scheduler.request import Request
from worker.sampler import draw

MAX_NGRAM = 3
MIN_NGRAM = 1
ACCEPTANCE_DECAY = 0.7  # weight of the past in a request's running acceptance rate


def propose_ngram(token_ids: Sequence[int], num_tokens: int) -> list[int]:
    """Up to `num_tokens` tokens that followed the most recent earlier occurrence of the sequence's last n-gram,
    longest n first; [] when no n-gram recurs."""
    if num_tokens < 1:
        return []
    packed = array("q", token_ids).tobytes()  # rfind over bytes: a C scan instead of a Python loop per position
    width = array("q").itemsize
    length = len(token_ids)
    for n in range(min(MAX_NGRAM, length - 1), MIN_NGRAM - 1, -1):
        tail = packed[(length - n) * width :]
        end = (length - 1) * width  # an occurrence must start before the tail does
        while (found := packed.rfind(tail, 0, end)) >= 0:
            if found % width == 0:
                start = found // width + n
                return list(token_ids[start : start + num_tokens])
            end = found + len(tail) - 1
    return []


def verify_greedy(logits: torch.Tensor, proposed: list[int]) -> list[int]:
    """`logits` [k + 1, V] at the last real token and at each of the k proposed ones: the proposed tokens the
    model's argmax agrees with, in order, then the argmax after the last agreed one."""
    targets = logits.argmax(dim=-1).tolist()
    accepted = []
    for proposed_token, target in zip(proposed, targets, strict=False):
        if proposed_token != target:
            break
        accepted.append(proposed_token)
    return [*accepted, targets[len(accepted)]]


def verify_sampled(
    probs: torch.Tensor,  # [k + 1, V] the request's sampling distribution at the last real token and each proposal
    proposed: list[int],
    generator: torch.Generator | None,
) -> list[int]:
    """Leviathan et al.'s rule for a proposer that is certain of its token (q is one-hot, as prompt lookup is): keep
    proposed token x with probability p(x); at the first rejection draw from p with x removed, renormalized;
    after k acceptances draw the bonus token from p. The tokens are then distributed exactly as sampling from p
    one step at a time would give."""
    accepted = []
    for position, token in enumerate(proposed):
        row = probs[position]
        keep = torch.rand((), generator=generator, device=probs.device) < row[token]
        if bool(keep):
            accepted.append(token)
            continue
        residual = row.clone()
        residual[token] = 0.0
        return [*accepted, int(draw(residual[None], [generator])[0])]
    return [*accepted, int(draw(probs[len(proposed)][None], [generator])[0])]


@dataclass
class _Acceptance:
    rate: float = 1.0  # running fraction of proposed tokens accepted; optimistic until measured


@dataclass(frozen=True)
class SpeculationConfig:
    max_batch_size: int  # no proposals in steps with more running requests
    min_acceptance: float  # below this running rate a request proposes one token at a time


class Speculator:
    """The engine thread's proposer and per-request policy; `is_eligible` says which requests may speculate."""

    def __init__(self, config: SpeculationConfig, max_model_len: int) -> None:
        self.config = config
        self._max_model_len = max_model_len
        self._acceptance: dict[str, _Acceptance] = {}
        self.num_proposed_tokens = 0
        self.num_accepted_tokens = 0
        self.num_verifications = 0

    def propose(self, running: list[Request], max_proposal: Callable[[Request], int]) -> None:
        """Sets every running request's `spec_token_ids` for the coming step (most get none). `max_proposal` says
        how many tokens a request may propose at most: 0 when it must not speculate."""
        if len(running) > self.config.max_batch_size:
            for request in running:
                request.spec_token_ids = []
            return
        for request in running:
            is_decoding = request.num_computed_tokens == request.num_tokens - 1
            limit = min(max_proposal(request), self._max_model_len - request.num_tokens - 1) if is_decoding else 0
            if limit <= 0:
                request.spec_token_ids = []
                continue
            num_tokens = min(self._num_tokens_for(request, limit), limit)
            request.spec_token_ids = propose_ngram(request.prompt_token_ids + request.output_token_ids, num_tokens)

    def record(self, request_id: str, num_proposed: int, num_accepted: int) -> None:
        acceptance = self._acceptance.setdefault(request_id, _Acceptance())
        acceptance.rate = ACCEPTANCE_DECAY * acceptance.rate + (1 - ACCEPTANCE_DECAY) * num_accepted / num_proposed
        self.num_proposed_tokens += num_proposed
        self.num_accepted_tokens += num_accepted
        self.num_verifications += 1

    def forget(self, request_id: str) -> None:
        self._acceptance.pop(request_id, None)

    def _num_tokens_for(self, request: Request, limit: int) -> int:
        rate = self._acceptance.get(request.request_id, _Acceptance()).rate
        if rate < self.config.min_acceptance:
            return 1
        return max(1, round(limit * rate))
