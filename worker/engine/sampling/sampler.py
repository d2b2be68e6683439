"""Picks each row's next token on the device: grammar masks, logit biases, penalties, min_tokens, temperature,
top-k / top-p / min-p, a draw from the row's own generator, and the logprobs the request asked for.

Logprobs are those of the model's raw distribution (before logit biases, penalties and temperature), as vLLM reports
by default; for a row constrained by a grammar, of that distribution renormalized over the tokens the grammar allows
(the distribution the token was drawn from, before penalties and temperature), so disallowed tokens never appear.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field

import torch

from tasks.messages.generation import SamplingParams, TokenLogprob
from worker.engine.grammar.masks import mask_logits, rows_allowing_nothing
from worker.engine.grammar.matcher import RowGrammar, fill_bitmasks
from worker.engine.sampling.step_readback import read_back
from worker.engine.transfers import to_device

DEAD_END = "the grammar allows no token here: no text can complete it"
DEAD_END_HELD_BACK = "the grammar allows no token here but a stop token, which min_tokens holds back"
Argmax = Callable[[torch.Tensor], torch.Tensor]  # [S, V] -> [S] int64, the first largest index of each row


def torch_argmax(logits: torch.Tensor) -> torch.Tensor:
    return logits.argmax(dim=-1)


@dataclass(frozen=True)
class SamplingRow:
    params: SamplingParams
    generator: torch.Generator | None  # None: torch's default generator
    prompt_token_ids: list[int]
    output_token_ids: list[int]
    suppressed_token_ids: tuple[int, ...] = ()  # masked this step (stop tokens before min_tokens)
    grammar: RowGrammar | None = None  # a constrained row: only tokens its grammar allows next


@dataclass(frozen=True)
class SampledTokens:
    token_ids: list[int]
    logprobs: list[TokenLogprob | None]
    dead_ends: dict[int, str] = field(default_factory=dict)  # row -> why its grammar allows no token (its token: any)


def sample(
    logits: torch.Tensor,
    rows: list[SamplingRow],
    argmax: Argmax = torch_argmax,
    bitmasks: Future[torch.Tensor] | None = None,
) -> SampledTokens:
    """`logits` [S, V] float, row i belonging to rows[i]; `argmax` picks the greedy rows' tokens; `bitmasks`, the
    constrained rows' bitmasks in row order, when they were filled ahead."""
    logits, dead_ends = apply_grammars(logits, rows, bitmasks)
    raw_logits = logits
    logits = apply_logit_bias(logits, rows)
    logits = apply_penalties(logits, rows)
    logits = suppress_tokens(logits, rows)
    tokens = argmax(logits)  # [S]
    sampled_rows = [i for i, row in enumerate(rows) if not row.params.is_greedy]
    if sampled_rows:
        index = to_device(sampled_rows, torch.int64, logits.device)
        probs = sampling_probs(logits.index_select(0, index), [rows[i].params for i in sampled_rows])  # [S', V]
        draws = draw(probs, [rows[i].generator for i in sampled_rows])
        tokens.index_copy_(0, index, draws)
    num_logprobs = [row.params.logprobs for row in rows]
    return SampledTokens(*read_back(tokens, raw_logits, num_logprobs), dead_ends)  # the step's one device wait


def apply_grammars(
    logits: torch.Tensor, rows: list[SamplingRow], bitmasks: Future[torch.Tensor] | None = None
) -> tuple[torch.Tensor, dict[int, str]]:
    """Each constrained row's disallowed tokens at -inf; a batch without one is returned as it is, untouched. And
    the rows whose grammar dead-ends (allows no token, or none that may be written yet), with why: only the worker
    can tell, mid-generation; those rows are left unmasked, and whatever they draw is not theirs to keep."""
    constrained = [i for i, row in enumerate(rows) if row.grammar is not None]
    if not constrained:
        return logits, {}
    if bitmasks is None:
        bitmask = fill_bitmasks([rows[i].grammar for i in constrained], logits.shape[-1])  # type: ignore[misc]
    else:
        bitmask = bitmasks.result()
    suppressed = [rows[i].suppressed_token_ids for i in constrained]
    empty = rows_allowing_nothing(bitmask, logits.shape[-1], suppressed)
    dead_ends = {constrained[k]: DEAD_END_HELD_BACK if suppressed[k] else DEAD_END for k in empty}
    if empty:
        kept = [k for k in range(len(constrained)) if constrained[k] not in dead_ends]
        bitmask, constrained = bitmask[kept], [constrained[k] for k in kept]
    return (mask_logits(logits, bitmask, constrained) if constrained else logits), dead_ends


def apply_logit_bias(logits: torch.Tensor, rows: list[SamplingRow]) -> torch.Tensor:
    """OpenAI's logit_bias: each row's biases added to its logits on the device, in one scatter for the step."""
    biased = [(i, row.params.logit_bias) for i, row in enumerate(rows) if row.params.logit_bias]
    if not biased:
        return logits
    row_ids = [i for i, biases in biased for _ in biases]
    token_ids = [token_id for _, biases in biased for token_id, _ in biases]
    values = [bias for _, biases in biased for _, bias in biases]
    device = logits.device
    logits = logits.clone()
    logits.index_put_(
        (to_device(row_ids, torch.long, device), to_device(token_ids, torch.long, device)),
        to_device(values, logits.dtype, device),
        accumulate=True,
    )
    return logits


def apply_penalties(logits: torch.Tensor, rows: list[SamplingRow]) -> torch.Tensor:
    """vLLM's repetition penalty over prompt and output; OpenAI's presence and frequency penalties over output."""
    penalized = [i for i, row in enumerate(rows) if row.params.has_penalties]
    if not penalized:
        return logits
    logits = logits.clone()
    vocab_size = logits.shape[-1]
    for i in penalized:
        params = rows[i].params
        row = logits[i]  # [V]
        output_ids = to_device(rows[i].output_token_ids, torch.long, logits.device)
        # [V]; index_add_ rather than bincount, which on CUDA reads its input's max back to the host
        counts = logits.new_zeros(vocab_size).index_add_(0, output_ids, logits.new_ones(output_ids.shape))
        if params.repetition_penalty != 1.0:
            seen = (counts > 0).index_fill_(0, to_device(rows[i].prompt_token_ids, torch.long, logits.device), True)
            penalty = params.repetition_penalty
            row.copy_(torch.where(seen, torch.where(row > 0, row / penalty, row * penalty), row))
        row.sub_(params.frequency_penalty * counts + params.presence_penalty * (counts > 0).to(logits.dtype))
    return logits


def suppress_tokens(logits: torch.Tensor, rows: list[SamplingRow]) -> torch.Tensor:
    suppressed = [(i, row.suppressed_token_ids) for i, row in enumerate(rows) if row.suppressed_token_ids]
    if not suppressed:
        return logits
    logits = logits.clone()
    for i, token_ids in suppressed:
        logits[i].index_fill_(0, to_device(token_ids, torch.long, logits.device), float("-inf"))
    return logits


def sampling_probs(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    """Temperature, then top-k, top-p and min-p filtering, as probabilities [S, V]; the top token always survives."""
    device = logits.device
    temperature = to_device([p.temperature for p in params], torch.float32, device)
    top_k = to_device([p.top_k or logits.shape[-1] for p in params], torch.int64, device)
    top_p = to_device([p.top_p for p in params], torch.float32, device)
    min_p = to_device([p.min_p for p in params], torch.float32, device)
    sorted_logits, sorted_indices = (logits / temperature[:, None]).sort(dim=-1, descending=True)
    sorted_probs = sorted_logits.softmax(dim=-1)
    ranks = torch.arange(logits.shape[-1], device=device)[None, :]
    mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
    is_outside = (ranks >= top_k[:, None]) | ((mass_before >= top_p[:, None]) & (top_p[:, None] < 1.0))
    is_outside |= sorted_probs < min_p[:, None] * sorted_probs[:, :1]
    is_outside[:, 0] = False
    sorted_logits = sorted_logits.masked_fill(is_outside, float("-inf"))
    return torch.empty_like(logits).scatter_(-1, sorted_indices, sorted_logits).softmax(dim=-1)


def draw(probs: torch.Tensor, generators: list[torch.Generator | None]) -> torch.Tensor:
    """One token per row by the exponential race (argmax of p / Exp(1)), which is a draw from p; each row's noise
    comes from its own generator, so a seeded row draws the same whatever else is in the batch."""
    noise = torch.empty_like(probs)
    for i, generator in enumerate(generators):
        noise[i].exponential_(generator=generator)
    return (probs / noise.clamp_(min=torch.finfo(probs.dtype).tiny)).argmax(dim=-1)
