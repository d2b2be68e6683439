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
from worker.draft_policy import TIMING_DECAY, running_mean
from worker.kv_pool import KVPool
from worker.model_runner import paged_forward
from worker.paged_step import build_paged_step

PROPOSAL_PLACEHOLDER = 0  # stands for a proposed token between scheduling and the proposer's passes


@dataclass(frozen=True)
class DraftModel:
    """What a proposer runs: a causal LM whose attention goes through our paged attention, and the pool it uses."""

    model: PreTrainedModel
    kv_pool: KVPool
    device: torch.device
    is_flash: bool
    shares_target_pool: bool  # self-draft: the target's pool already holds its layers' K/V of computed tokens


class DraftProposer:
    """Fills in the proposed tokens of scheduled chunks; must be called from the engine thread."""

    def __init__(self, method: str, draft: DraftModel) -> None:
        self.method = method
        self.draft = draft
        self.seconds_per_pass = 0.0  # running mean of passes after the first; 0 until measured
        self._num_computed: dict[str, int] = {}  # own pool only: tokens whose draft K/V are in the blocks

    def fill(self, chunks: list[ScheduledChunk]) -> None:
        """Replaces each chunk's placeholder proposals (its request's `spec_token_ids`) with the draft's tokens."""
        for depth in range(max(chunk.num_spec_tokens for chunk in chunks)):
            requests = [chunk.request for chunk in chunks if chunk.num_spec_tokens > depth]
            started = time.perf_counter()
            tokens = self._propose_next([self._pass_chunk(request, depth) for request in requests])
            if depth > 0:  # the first pass also catches up on whatever the draft has not seen: not a proposal's cost
                self.seconds_per_pass = running_mean(self.seconds_per_pass, time.perf_counter() - started, TIMING_DECAY)
            for request, token in zip(requests, tokens, strict=True):
                request.spec_token_ids[depth] = token
        if not self.draft.shares_target_pool:
            for chunk in chunks:  # every pass wrote its input token's K/V, the last proposal's excepted
                self._num_computed[chunk.request.request_id] = chunk.request.num_tokens + chunk.num_spec_tokens - 1

    def forget(self, request_id: str) -> None:
        """The request finished or lost its blocks: its draft K/V are no longer there."""
        self._num_computed.pop(request_id, None)

    def _pass_chunk(self, request: Request, depth: int) -> ScheduledChunk:
        """Pass 0 computes whatever the draft lacks up to the last real token; pass d, proposed token d - 1."""
        if depth == 0:
            start = self._first_uncomputed(request)
            return ScheduledChunk(request, start, request.num_tokens - start, is_sampling=True)
        return ScheduledChunk(request, request.num_tokens - 1 + depth, 1, is_sampling=True)

    def _first_uncomputed(self, request: Request) -> int:
        if self.draft.shares_target_pool:
            return request.num_computed_tokens
        # rejected proposals' K/V lie past what the target kept, so the draft's valid K/V end there too
        return min(self._num_computed.get(request.request_id, 0), request.num_computed_tokens)

    def _propose_next(self, chunks: list[ScheduledChunk]) -> list[int]:
        draft = self.draft
        step = build_paged_step(Batch(chunks), draft.kv_pool.block_size, draft.device, for_flash=draft.is_flash)
        return paged_forward(draft.model, step, draft.kv_pool).argmax(dim=-1).tolist()
