"""Picks the next token per row: greedy, or temperature + top-p (nucleus) sampling with the row's own generator."""

from __future__ import annotations

import torch

from tasks.messages import SamplingParams


def sample_next_tokens(
    logits: torch.Tensor,  # [B, V] float
    params: list[SamplingParams],
    generators: list[torch.Generator | None],
) -> torch.Tensor:
    """Returns the next token per row, [B] long.

    A row's draw uses only its own generator (None: torch's default one), so a seeded request samples the same
    tokens whatever else shares the batch. Rows that share a generator object are drawn together.
    """
    tokens = logits.argmax(dim=-1)  # [B]
    sampled_rows = [row for row, p in enumerate(params) if not p.is_greedy]
    if not sampled_rows:
        return tokens
    rows = torch.tensor(sampled_rows, device=logits.device)
    temperature = torch.tensor([params[r].temperature for r in sampled_rows], device=logits.device)
    top_p = torch.tensor([params[r].top_p for r in sampled_rows], device=logits.device)
    probs = nucleus_probs(logits[rows] / temperature[:, None], top_p)  # [S, V]
    for generator, positions in group_by_generator([generators[r] for r in sampled_rows]).items():
        draws = torch.multinomial(probs[positions], num_samples=1, generator=generator).squeeze(1)
        tokens[rows[positions]] = draws
    return tokens


def nucleus_probs(
    logits: torch.Tensor,  # [S, V]
    top_p: torch.Tensor,  # [S]
) -> torch.Tensor:
    """Softmax over the smallest set of tokens whose probability reaches top_p; the top token is always kept."""
    sorted_logits, sorted_indices = logits.sort(dim=-1, descending=True)
    sorted_probs = sorted_logits.softmax(dim=-1)
    mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
    is_outside = (mass_before >= top_p[:, None]) & (top_p[:, None] < 1.0)
    is_outside[:, 0] = False
    sorted_logits = sorted_logits.masked_fill(is_outside, float("-inf"))
    filtered = torch.empty_like(logits).scatter_(-1, sorted_indices, sorted_logits)
    return filtered.softmax(dim=-1)


def group_by_generator(generators: list[torch.Generator | None]) -> dict[torch.Generator | None, list[int]]:
    """Positions of each distinct generator object, in order."""
    groups: dict[torch.Generator | None, list[int]] = {}
    for position, generator in enumerate(generators):
        groups.setdefault(generator, []).append(position)
    return groups
