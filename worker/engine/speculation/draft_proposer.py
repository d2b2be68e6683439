"""Model-based proposers for speculative decoding: a smaller draft model over its own KV pool, or the target's own
first layers (self-draft) over the target's pool.

A proposer runs k forward passes for all its rows together, the first over each row's tokens it has not computed
yet, each later one over the token the previous pass proposed, and proposes greedily. Its proposal is then a
deterministic function of the tokens, a one-hot q, so the verification rules the engine already applies (greedy
prefix, or Leviathan's rule with one-hot q) keep the target's outputs exactly.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from transformers import PreTrainedModel

from scheduler.batch import Batch, ScheduledChunk
from scheduler.request import Request
from worker.engine.attention.backend import AttentionBackend
from worker.engine.attention.kv_pool import KVPool
from worker.engine.attention.paged_step import build_paged_step
from worker.engine.model_runner import paged_forward
from worker.engine.speculation.draft_policy import TIMING_DECAY, running_mean

PROPOSAL_PLACEHOLDER = 0  # stands for a proposed token between scheduling and the proposer's passes


@dataclass(frozen=True)
class DraftModel:
    """What a proposer runs: a causal LM whose attention goes through our paged attention, and the pool it uses."""

    model: PreTrainedModel
    kv_pool: KVPool
    device: torch.device
    attention_backend: AttentionBackend
    shares_target_pool: bool  # self-draft: the target's pool already holds its layers' K/V of computed tokens


class DraftProposer:
    """Fills in the proposed tokens of scheduled chunks; must be called from the engine thread."""

    def __init__(self, draft: DraftModel, max_catch_up_tokens: int) -> None:
        self.draft = draft
        self.seconds_per_pass: float | None = None  # running mean of passes over one token a row; None: unmeasured
        self._max_catch_up_tokens = max_catch_up_tokens  # a pass's prefill per row: a step's chunk, not a prompt
        self._num_computed: dict[str, int] = {}  # own pool only: tokens whose draft K/V are in the blocks

    def fill(self, chunks: list[ScheduledChunk]) -> list[ScheduledChunk]:
        """Replaces each chunk's placeholder proposals (its request's `spec_token_ids`) with the draft's tokens;
        returns the chunks left with placeholders, whose draft is still catching up on their tokens."""
        first_pass = [self._pass_chunk(chunk.request, 0) for chunk in chunks]
        ready = []
        for chunk, first, token in zip(chunks, first_pass, self._timed_pass(first_pass), strict=True):
            if first.end == chunk.request.num_tokens:  # caught up: the token is the row's first proposal
                chunk.request.spec_token_ids[0] = token
                ready.append(chunk)
        for depth in range(1, max((chunk.num_spec_tokens for chunk in ready), default=0)):
            passes = [self._pass_chunk(chunk.request, depth) for chunk in ready if chunk.num_spec_tokens > depth]
            for pass_chunk, token in zip(passes, self._timed_pass(passes), strict=True):
                pass_chunk.request.spec_token_ids[depth] = token
        if not self.draft.shares_target_pool:
            for first in first_pass:
                self._num_computed[first.request.request_id] = first.end
            for chunk in ready:  # every pass wrote its input token's K/V, the last proposal's excepted
                self._num_computed[chunk.request.request_id] = chunk.request.num_tokens + chunk.num_spec_tokens - 1
        return [chunk for chunk in chunks if chunk not in ready]

    def rewind(self, request_id: str, num_proposed: int, num_accepted: int) -> None:
        """After verification: the draft K/V of rejected proposals no longer stand for the request's tokens."""
        if request_id in self._num_computed:
            self._num_computed[request_id] -= num_proposed - 1 - min(num_accepted, num_proposed - 1)

    def forget(self, request_id: str) -> None:
        """The request finished or lost its blocks: its draft K/V are no longer there."""
        self._num_computed.pop(request_id, None)

    def _pass_chunk(self, request: Request, depth: int) -> ScheduledChunk:
        """Pass 0 computes whatever the draft lacks up to the last real token (at most a catch-up's worth); pass d,
        proposed token d - 1."""
        if depth == 0:
            start = self._first_uncomputed(request)
            num_tokens = min(request.num_tokens - start, self._max_catch_up_tokens)
            return ScheduledChunk(request, start, num_tokens, is_sampling=True)
        return ScheduledChunk(request, request.num_tokens - 1 + depth, 1, is_sampling=True)

    def _first_uncomputed(self, request: Request) -> int:
        if self.draft.shares_target_pool:
            return request.num_computed_tokens
        return min(self._num_computed.get(request.request_id, 0), request.num_computed_tokens)

    def _timed_pass(self, chunks: list[ScheduledChunk]) -> list[int]:
        """The draft's greedy next token after each chunk; passes of one token a row time a proposal's cost."""
        started = time.perf_counter()
        draft = self.draft
        step = build_paged_step(Batch(chunks), draft.kv_pool, draft.device, draft.attention_backend)
        tokens = paged_forward(draft.model, step, draft.kv_pool).argmax(dim=-1).tolist()
        if all(chunk.num_tokens == 1 for chunk in chunks):  # a catch-up's prefill is no proposal's cost
            self.seconds_per_pass = running_mean(self.seconds_per_pass, time.perf_counter() - started, TIMING_DECAY)
        return tokens
