"""Each sampling chunk's new tokens from the step's logits: the sampler for plain rows, verification (greedy, or
rejection sampling) for rows that carried proposed tokens.

The whole step is sampled at once; if that raises, each row is sampled alone, so that a row whose parameters break
the sampler fails by itself and every other row gets the token it would have had."""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import Future, wait
from dataclasses import dataclass, field

import torch

from scheduler.batch import ScheduledChunk
from scheduler.request import Request
from tasks.messages.generation import TokenLogprob
from worker.engine.sampling.sampler import Argmax, SamplingRow, sample, sampling_probs, torch_argmax
from worker.engine.speculation.speculator import verify_greedy, verify_sampled
from worker.engine.transfers import to_device

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Verification:
    request_id: str
    num_proposed: int
    num_accepted: int


@dataclass(frozen=True)
class StepTokens:
    token_ids: list[list[int]]  # per sampling chunk: accepted proposed tokens, then one new token
    logprobs: list[TokenLogprob | None]  # per sampling chunk (rows that speculate never ask for logprobs)
    verifications: list[Verification]
    failed: dict[str, str] = field(default_factory=dict)  # request id -> why its row could not be sampled
    dead_ends: dict[str, str] = field(default_factory=dict)  # request id -> why its grammar allows no token now


def pick_tokens(
    chunks: list[ScheduledChunk],
    logits: torch.Tensor,  # [sum of chunks' num_logits, V]
    sampling_row: Callable[[Request], SamplingRow],
    argmax: Argmax = torch_argmax,
    bitmasks: Future[torch.Tensor] | None = None,  # the constrained rows', in chunk order, filled ahead
) -> StepTokens:
    try:
        return pick_all_tokens(chunks, logits, sampling_row, argmax, bitmasks)
    except Exception:
        logger.exception("sampling a step of %d rows failed; sampling each row alone", len(chunks))
        if bitmasks is not None:
            wait([bitmasks])  # its thread is done with the matchers before each row fills its own mask
        return pick_tokens_row_by_row(chunks, logits, sampling_row, argmax)


def pick_tokens_row_by_row(
    chunks: list[ScheduledChunk],
    logits: torch.Tensor,  # [sum of chunks' num_logits, V]
    sampling_row: Callable[[Request], SamplingRow],
    argmax: Argmax,
) -> StepTokens:
    picked = StepTokens([], [], [])
    first_row = 0
    for chunk in chunks:
        rows = logits[first_row : first_row + chunk.num_logits]
        first_row += chunk.num_logits
        try:
            alone = pick_all_tokens([chunk], rows, sampling_row, argmax)
        except Exception as exc:
            picked.token_ids.append([])
            picked.logprobs.append(None)
            picked.failed[chunk.request.request_id] = f"{type(exc).__name__}: {exc}"
            continue
        picked.token_ids.extend(alone.token_ids)
        picked.logprobs.extend(alone.logprobs)
        picked.verifications.extend(alone.verifications)
        picked.dead_ends.update(alone.dead_ends)
    return picked


def pick_all_tokens(
    chunks: list[ScheduledChunk],
    logits: torch.Tensor,  # [sum of chunks' num_logits, V]
    sampling_row: Callable[[Request], SamplingRow],
    argmax: Argmax = torch_argmax,
    bitmasks: Future[torch.Tensor] | None = None,
) -> StepTokens:
    first_rows, row = [], 0
    for chunk in chunks:
        first_rows.append(row)
        row += chunk.num_logits
    plain = [i for i, chunk in enumerate(chunks) if not chunk.num_spec_tokens]
    if len(plain) == logits.shape[0]:  # no proposed tokens this step: the logits are the plain rows, in order
        plain_logits = logits
    else:
        index = to_device([first_rows[i] for i in plain], torch.long, logits.device)
        plain_logits = logits.index_select(0, index)
    sampled = sample(plain_logits, [sampling_row(chunks[i].request) for i in plain], argmax, bitmasks)
    token_ids: list[list[int]] = [[] for _ in chunks]
    logprobs: list[TokenLogprob | None] = [None] * len(chunks)
    for position, i in enumerate(plain):
        token_ids[i], logprobs[i] = [sampled.token_ids[position]], sampled.logprobs[position]
    verifications = []
    for i, chunk in enumerate(chunks):
        if chunk.num_spec_tokens:
            proposed = chunk.token_ids[-chunk.num_spec_tokens :]
            rows = logits[first_rows[i] : first_rows[i] + chunk.num_logits]  # [k + 1, V]
            token_ids[i] = verify(rows, proposed, sampling_row(chunk.request))
            verifications.append(Verification(chunk.request.request_id, len(proposed), len(token_ids[i]) - 1))
    dead_ends = {chunks[plain[row]].request.request_id: why for row, why in sampled.dead_ends.items()}
    return StepTokens(token_ids, logprobs, verifications, dead_ends=dead_ends)


def verify(logits: torch.Tensor, proposed: list[int], row: SamplingRow) -> list[int]:
    """Greedy rows keep what the argmax agrees with; sampled rows follow the rejection-sampling rule."""
    if row.params.is_greedy:
        return verify_greedy(logits, proposed)
    probs = sampling_probs(logits, [row.params] * logits.shape[0])  # [k + 1, V]
    return verify_sampled(probs, proposed, row.generator)
