from __future__ import annotations

import dataclasses

import pytest
import torch

from tasks.messages.generation import SamplingParams
from worker.engine.sampling.sampler import SamplingRow, apply_logit_bias, apply_penalties, sample, sampling_probs

VOCAB_SIZE = 50


def sample_next_tokens(
    logits: torch.Tensor, params: list[SamplingParams], generators: list[torch.Generator | None]
) -> torch.Tensor:
    rows = [SamplingRow(p, g, [], []) for p, g in zip(params, generators, strict=True)]
    return torch.tensor(sample(logits, rows).token_ids)


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


def test_draws_follow_the_softmax() -> None:
    logits = torch.tensor([[1.0, 0.0, -1.0, 2.0]])
    params = [SamplingParams(max_tokens=1, temperature=1.0)]
    counts = torch.bincount(torch.tensor([t for [t] in draws(logits, params, [11], num_draws=4000)]), minlength=4)
    expected = logits.softmax(-1)[0] * 4000
    assert torch.all((counts - expected).abs() < 4 * expected.sqrt() + 5), (counts, expected)


def test_top_k_and_min_p_cut_the_tail() -> None:
    logits = torch.tensor([[3.0, 2.0, 1.0, 0.0, -1.0]])
    top_2 = sampling_probs(logits, [SamplingParams(max_tokens=1, top_k=2)])
    assert (top_2[0, 2:] == 0).all() and top_2[0, :2].sum() == pytest.approx(1.0)
    min_p = sampling_probs(logits, [SamplingParams(max_tokens=1, min_p=0.3)])  # keeps p >= 0.3 * p_top
    assert (min_p[0] > 0).tolist() == [True, True, False, False, False]


def test_penalties_follow_vllm_and_openai() -> None:
    logits = torch.tensor([[2.0, -2.0, 1.0, 0.5]])
    params = SamplingParams(max_tokens=1, repetition_penalty=2.0, frequency_penalty=0.5, presence_penalty=0.25)
    row = SamplingRow(params, None, prompt_token_ids=[0], output_token_ids=[1, 1, 2])
    penalized = apply_penalties(logits, [row])[0].tolist()
    # token 0 seen in the prompt: repetition only; 1 twice in the output: repetition x2 on a negative logit,
    # frequency 2 x 0.5, presence 0.25; 2 once: halved, then 0.5 + 0.25; 3 unseen
    assert penalized == pytest.approx([1.0, -4.0 - 1.0 - 0.25, 0.5 - 0.5 - 0.25, 0.5])
    assert logits.tolist() == [[2.0, -2.0, 1.0, 0.5]], "the caller's logits are not modified"


def test_suppressed_tokens_are_never_picked() -> None:
    logits = torch.tensor([[5.0, 1.0, 0.0]])
    row = SamplingRow(SamplingParams(max_tokens=1, temperature=0.0), None, [], [], suppressed_token_ids=(0,))
    assert sample(logits, [row]).token_ids == [1]


def test_logprobs_are_raw_log_softmax_with_the_top_k() -> None:
    logits = torch.tensor([[1.0, 3.0, 2.0]])
    params = SamplingParams(max_tokens=1, temperature=0.0, logprobs=2, presence_penalty=1.0)
    [entry] = sample(logits, [SamplingRow(params, None, [], [1])]).logprobs
    expected = logits.log_softmax(-1)[0]
    assert entry.token_id == 1 and entry.logprob == pytest.approx(float(expected[1]))
    assert [token for token, _ in entry.top] == [1, 2]
    assert sample(logits, [SamplingRow(SamplingParams(max_tokens=1), None, [], [])]).logprobs == [None]


def test_logit_bias_adds_to_its_own_row_only_and_leaves_the_logprobs_raw() -> None:
    logits = random_logits(3)
    biased = SamplingParams(max_tokens=1, temperature=0.0, logit_bias=((7, 100.0), (logits[0].argmax().item(), -100.0)))
    plain = SamplingParams(max_tokens=1, temperature=0.0, logprobs=0)
    rows = [SamplingRow(p, None, [], []) for p in (biased, plain, dataclasses.replace(biased, logprobs=0))]
    shifted = apply_logit_bias(logits, rows)
    assert shifted[0, 7] == pytest.approx(logits[0, 7] + 100) and torch.equal(shifted[1], logits[1])
    sampled = sample(logits, rows)
    assert sampled.token_ids == [7, logits[1].argmax().item(), 7]
    assert sampled.logprobs[2].logprob == pytest.approx(torch.log_softmax(logits[2], -1)[7].item(), abs=1e-5)
