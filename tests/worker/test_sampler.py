from __future__ import annotations

import torch

from tasks.messages import SamplingParams
from worker.sampler import sample_next_tokens

VOCAB_SIZE = 50


def random_logits(num_rows: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(num_rows, VOCAB_SIZE, generator=torch.Generator().manual_seed(seed)) * 3  # [B, V]


def draws(logits: torch.Tensor, params: list[SamplingParams], seeds: list[int | None], num_draws: int) -> list[list]:
    generators = [None if seed is None else torch.Generator().manual_seed(seed) for seed in seeds]
    return [sample_next_tokens(logits, params, generators).tolist() for _ in range(num_draws)]


def test_greedy_is_argmax() -> None:
    logits = random_logits(4)
    params = [SamplingParams(max_tokens=1, temperature=0.0)] * 4
    assert sample_next_tokens(logits, params, [None] * 4).tolist() == logits.argmax(dim=-1).tolist()


def test_tiny_top_p_keeps_only_the_top_token() -> None:
    logits = random_logits(3)
    params = [SamplingParams(max_tokens=1, temperature=1.5, top_p=1e-6)] * 3
    generators = [torch.Generator().manual_seed(row) for row in range(3)]
    for _ in range(20):
        assert sample_next_tokens(logits, params, generators).tolist() == logits.argmax(dim=-1).tolist()


def test_top_p_samples_only_inside_the_nucleus() -> None:
    logits = torch.tensor([[4.0, 3.9, 0.0, -1.0, -2.0]])
    params = [SamplingParams(max_tokens=1, temperature=1.0, top_p=0.9)]
    seen = {token for [token] in draws(logits, params, [7], num_draws=200)}
    assert seen == {0, 1}


def test_full_top_p_reaches_the_tail() -> None:
    logits = torch.zeros(1, 4)
    params = [SamplingParams(max_tokens=1, temperature=1.0, top_p=1.0)]
    assert {token for [token] in draws(logits, params, [3], num_draws=200)} == {0, 1, 2, 3}


def test_same_seed_same_draws_whatever_else_is_in_the_batch() -> None:
    logits = random_logits(4)
    seeded = SamplingParams(max_tokens=1, temperature=1.0, top_p=0.95, seed=42)
    alone = draws(logits[:1], [seeded], [42], num_draws=30)
    others = [SamplingParams(max_tokens=1, temperature=0.7), SamplingParams(max_tokens=1, temperature=0.0)]
    crowd_logits = torch.cat([random_logits(1, seed=5), logits[:1], random_logits(2, seed=6)])
    crowd = draws(crowd_logits, [others[0], seeded, others[1], others[0]], [None, 42, None, 9], num_draws=30)
    assert [row[1] for row in crowd] == [row[0] for row in alone]


def test_different_seeds_differ() -> None:
    logits = random_logits(1)
    params = [SamplingParams(max_tokens=1, temperature=1.0)]
    assert draws(logits, params, [1], num_draws=30) != draws(logits, params, [2], num_draws=30)


def test_greedy_rows_are_unaffected_by_sampling_rows() -> None:
    logits = random_logits(4)
    greedy = SamplingParams(max_tokens=1, temperature=0.0)
    sampled = SamplingParams(max_tokens=1, temperature=2.0)
    tokens = draws(logits, [greedy, sampled, greedy, sampled], [None, None, None, 5], num_draws=30)
    expected = logits.argmax(dim=-1).tolist()
    assert all(row[0] == expected[0] and row[2] == expected[2] for row in tokens)
    assert len({(row[1], row[3]) for row in tokens}) > 1
