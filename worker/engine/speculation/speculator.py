"""Speculative decoding: a proposer guesses the tokens that follow, the next step's forward pass verifies them all,
and the request keeps the longest prefix the model agrees with (greedy) or that the rejection-sampling rule keeps
(sampling), plus one token of the model's own.

Proposers: prompt lookup (what followed the last occurrence of the request's latest n-gram in its own prompt and
output), and the model-based ones of `worker.engine.speculation.draft_proposer` (a draft model, or the target's own
first layers).
Only greedy or unseeded requests without penalties, logprobs, pending min_tokens, steering or monitoring speculate
(a seeded sampled row's draws must not depend on its batch): for them greedy output is exactly what plain decoding
produces, and sampled output is distributed exactly as it would be.
Each request's number of proposed tokens adapts to how many it has had accepted (and, for a model proposer, to what
a proposal costs), and nothing is proposed in steps with more running requests than `spec_max_batch_size`, where
the extra tokens would cost more than they save.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from scheduler.batch import Batch
from scheduler.request import Request
from worker.engine.sampling.sampler import draw
from worker.engine.speculation.draft_policy import DraftPolicy, StepCost, StepTimer
from worker.engine.speculation.draft_proposer import PROPOSAL_PLACEHOLDER, DraftProposer

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
    """Leviathan et al.'s rule for a proposer that is certain of its token (q is one-hot, as prompt lookup and our
    greedy draft models are): keep proposed token x with probability p(x); at the first rejection draw from p with
    x removed, renormalized; after k acceptances draw the bonus token from p. The tokens are then distributed
    exactly as sampling from p one step at a time would give."""
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


@dataclass(frozen=True)
class Allowance:
    """What a request may propose in the coming step."""

    method: str  # "ngram", "draft" or "self"
    max_tokens: int  # 0: it must not speculate


@dataclass
class _Acceptance:
    rate: float = 1.0  # running fraction of proposed tokens accepted; optimistic until measured
    method: str = "ngram"  # the proposer it was measured for


@dataclass(frozen=True)
class SpeculationConfig:
    max_batch_size: int  # no proposals in steps with more running requests
    min_acceptance: float  # below this running rate a request proposes one token at a time


class Speculator:
    """The engine thread's proposers and their policy. `propose` decides, before the step is scheduled, how many
    tokens each request proposes (prompt lookup fills them in at once; a request's length follows its acceptance
    rate); `fill_proposals`, once the scheduler has given them KV slots, runs the model proposers, whose length is
    the step's (`worker.engine.speculation.draft_policy`)."""

    def __init__(
        self, config: SpeculationConfig, max_model_len: int, proposers: dict[str, DraftProposer] | None = None
    ) -> None:
        self.config = config
        self._max_model_len = max_model_len
        self._proposers = proposers or {}
        self._policies = {method: DraftPolicy() for method in self._proposers}
        self._acceptance: dict[str, _Acceptance] = {}
        self._model_methods: dict[str, str] = {}  # this step's placeholders: request id -> the proposer to fill them
        self.step_timer = StepTimer()
        self.num_proposed_tokens = 0
        self.num_accepted_tokens = 0
        self.num_verifications = 0

    @property
    def methods(self) -> frozenset[str]:
        return frozenset({"ngram", *self._proposers})

    def propose(self, running: list[Request], allowance: Callable[[Request], Allowance]) -> None:
        """Sets every running request's `spec_token_ids` for the coming step (most get none)."""
        self._model_methods = {}
        if len(running) > self.config.max_batch_size:
            for request in running:
                request.spec_token_ids = []
            return
        model_rows: dict[str, list[tuple[Request, int]]] = {method: [] for method in self._proposers}
        for request in running:
            allowed = allowance(request)
            is_decoding = request.num_computed_tokens == request.num_tokens - 1
            limit = min(allowed.max_tokens, self._max_model_len - request.num_tokens - 1) if is_decoding else 0
            request.spec_token_ids = []
            if limit > 0 and allowed.method == "ngram":
                num_tokens = min(self._num_tokens_for(request, limit), limit)
                request.spec_token_ids = propose_ngram(request.prompt_token_ids + request.output_token_ids, num_tokens)
            elif limit > 0:
                model_rows[allowed.method].append((request, limit))
        for method, rows in model_rows.items():
            if rows:
                self._propose_placeholders(method, rows, len(running))

    def fill_proposals(self, batch: Batch) -> None:
        """Runs the model proposers for the scheduled chunks whose placeholders the scheduler kept. A row whose draft
        is still catching up on its tokens proposes by prompt lookup this step instead (any proposal is verified
        exactly; a placeholder would only be rejected)."""
        for request in batch.preempted:  # their blocks, and so any draft K/V in them, are gone
            self._forget_draft(request.request_id)
        if not self._model_methods:  # most steps: no row asked a model proposer
            return
        for method, proposer in self._proposers.items():
            chunks = [
                chunk
                for chunk in batch.sampling_chunks
                if chunk.num_spec_tokens and self._model_methods.get(chunk.request.request_id) == method
            ]
            for behind in proposer.fill(chunks) if chunks else ():
                request = behind.request
                looked_up = propose_ngram(request.prompt_token_ids + request.output_token_ids, behind.num_spec_tokens)
                request.spec_token_ids[: len(looked_up)] = looked_up

    def record_step(self, batch: Batch, seconds: float) -> None:
        """Times the engine's step, for the model proposers' cost model."""
        num_proposed = sum(chunk.num_spec_tokens for chunk in batch.chunks)
        is_decode_only = all(chunk.is_sampling and chunk.num_tokens == chunk.num_logits for chunk in batch.chunks)
        self.step_timer.record(seconds, len(batch.chunks), num_proposed, is_decode_only)

    def record(self, request_id: str, num_proposed: int, num_accepted: int) -> None:
        acceptance = self._acceptance.setdefault(request_id, _Acceptance())
        acceptance.rate = ACCEPTANCE_DECAY * acceptance.rate + (1 - ACCEPTANCE_DECAY) * num_accepted / num_proposed
        if acceptance.method in self._policies:
            self._policies[acceptance.method].record(num_proposed, num_accepted)
            self._proposers[acceptance.method].rewind(request_id, num_proposed, num_accepted)
        self.num_proposed_tokens += num_proposed
        self.num_accepted_tokens += num_accepted
        self.num_verifications += 1

    def forget(self, request_id: str) -> None:
        self._acceptance.pop(request_id, None)
        self._forget_draft(request_id)

    def _forget_draft(self, request_id: str) -> None:
        for proposer in self._proposers.values():
            proposer.forget(request_id)

    def _num_tokens_for(self, request: Request, limit: int) -> int:
        rate = self._acceptance.get(request.request_id, _Acceptance()).rate
        if rate < self.config.min_acceptance:
            return 1
        return max(1, round(limit * rate))

    def _propose_placeholders(self, method: str, rows: list[tuple[Request, int]], num_running: int) -> None:
        """Placeholders for the proposer's rows: the passes that pay off for the step, and of those, as many as each
        row's own acceptance pays for."""
        policy = self._policies[method]
        acceptances = []
        for request, _ in rows:
            acceptance = self._acceptance.get(request.request_id)
            if acceptance is None or acceptance.method != method:  # new to this proposer: start from its record
                acceptance = self._acceptance[request.request_id] = _Acceptance(policy.prior_rate, method)
            acceptances.append(acceptance)
        timer = self.step_timer
        cost = StepCost(timer.plain_s(num_running), self._proposers[method].seconds_per_pass, timer.verify_token_s)
        rates = [acceptance.rate for acceptance in acceptances]
        lengths = policy.lengths(rates, [limit for _, limit in rows], num_running, cost)
        for (request, _), acceptance, num_tokens in zip(rows, acceptances, lengths, strict=True):
            if num_tokens == 0:  # a row that proposes nothing learns nothing: let an old streak fade
                acceptance.rate = policy.aged(acceptance.rate)
                continue
            request.spec_token_ids = [PROPOSAL_PLACEHOLDER] * num_tokens
            self._model_methods[request.request_id] = method
