"""Prompt-lookup speculative decoding: the proposer and verifier alone, then the engine, whose greedy output must be
token-identical with speculation on and off, alone and beside rows that do not speculate."""

from __future__ import annotations

import dataclasses
import random

import pytest
import torch
from transformers import PreTrainedModel

from scheduler.request import Request
from tasks.config import Config
from tasks.messages.generation import SamplingParams
from tests.worker.engine_harness import greedy, hf_greedy, run, serve, submit_together
from worker.engine.continuous_engine import ContinuousEngine
from worker.engine.interface import EngineRequest
from worker.engine.model_runner import ModelRunner
from worker.engine.speculation.speculator import (
    Allowance,
    SpeculationConfig,
    Speculator,
    propose_ngram,
    verify_greedy,
    verify_sampled,
)

SPEC = SpeculationConfig(max_batch_size=2, min_acceptance=0.3)
NGRAM_4 = Allowance("ngram", 4)


@pytest.mark.parametrize(
    ("tokens", "num", "expected"),
    [
        ([1, 2, 3, 4, 1, 2], 3, [3, 4, 1]),  # the longest recurring n-gram wins
        ([1, 2, 3, 9, 2, 3], 2, [9, 2]),
        ([5, 6, 7], 2, []),  # nothing recurs
        ([7, 7, 7], 4, [7]),  # only what exists after the occurrence
        ([256, 1, 256], 1, [1]),  # byte patterns across token boundaries never match
        ([1, 2, 3], 0, []),
    ],
)
def test_propose_ngram(tokens: list[int], num: int, expected: list[int]) -> None:
    assert propose_ngram(tokens, num) == expected


def test_verify_greedy_keeps_the_agreeing_prefix_and_the_models_next_token() -> None:
    logits = torch.full((4, 10), -1.0)
    for row, token in enumerate([5, 6, 9, 2]):
        logits[row, token] = 1.0
    assert verify_greedy(logits, [5, 6, 7]) == [5, 6, 9]
    assert verify_greedy(logits, [1, 6, 9]) == [5]
    assert verify_greedy(logits, [5, 6, 9]) == [5, 6, 9, 2]  # all accepted: the bonus token too


def running_request(request_id: str, tokens: list[int]) -> Request:
    request = Request(request_id, tokens, max_tokens=50)
    request.num_computed_tokens = len(tokens) - 1
    return request


def test_the_proposal_length_follows_acceptance_and_stops_at_large_batches() -> None:
    speculator = Speculator(SPEC, max_model_len=1000)
    good, bad = running_request("good", [1, 2, 3, 4, 5, 1, 2]), running_request("bad", [1, 2, 3, 4, 5, 1, 2])
    speculator.propose([good, bad], lambda _: NGRAM_4)
    assert good.spec_token_ids == bad.spec_token_ids == [3, 4, 5, 1]
    for _ in range(5):
        speculator.record("good", 4, 4)
        speculator.record("bad", 4, 0)
    speculator.propose([good, bad], lambda _: NGRAM_4)
    assert len(good.spec_token_ids) == 4 and len(bad.spec_token_ids) == 1
    third = running_request("third", [1, 2, 1])
    speculator.propose([good, bad, third], lambda _: NGRAM_4)
    assert good.spec_token_ids == bad.spec_token_ids == third.spec_token_ids == []


def test_proposals_stay_within_the_engines_limit_and_the_context() -> None:
    speculator = Speculator(SPEC, max_model_len=7)
    near_end, ineligible = running_request("near-end", [1, 2, 3, 1, 2]), running_request("steered", [1, 2, 1])
    speculator.propose(
        [near_end, ineligible], lambda r: Allowance("ngram", 0) if r.request_id == "steered" else NGRAM_4
    )
    assert near_end.spec_token_ids == [3]  # 5 tokens + 1 proposed + the model's own = the context of 7
    assert ineligible.spec_token_ids == []


def grounded_prompt(seed: int) -> list[int]:
    """A passage, then the start of its copy: prompt lookup's home ground."""
    rng = random.Random(seed)
    passage = [rng.randrange(5, 2000) for _ in range(60)]
    return [*passage, *passage, *passage[:10]]


def self_repeating_prompt(reference: PreTrainedModel, seed: int, num_tokens: int = 20) -> list[int]:
    """A grounded prompt, what this model greedily writes after it, then the grounded prompt again. Whether a model
    copies a passage of random tokens depends on how its training came out (the tiny model's weights differ by CPU);
    here its next tokens follow the same context as its own earlier text, which prompt lookup then finds to propose."""
    prompt = grounded_prompt(seed)
    return [*prompt, *hf_greedy(reference, frozenset(), prompt, num_tokens), *prompt]


def lookup_agreements(prompt: list[int], output: list[int]) -> list[bool]:
    """For each decode step of a greedy run of `prompt` at which prompt lookup has a token to propose, whether the
    model's own next token (from its greedy `output`) is that token. A speculating run produces the same tokens and,
    until it accepts one, takes these steps one token at a time; the first proposed token does not depend on how many
    are proposed. So it proposes iff this list is not empty, and accepts a token iff one of them agrees."""
    agreements = []
    for i in range(1, len(output) - 1):  # a row proposes only while it has a token left beyond the one it verifies
        proposed = propose_ngram([*prompt, *output[:i]], 1)
        if proposed:
            agreements.append(proposed[0] == output[i])
    return agreements


def assert_greedy_matches_hf_alone_and_mixed(
    engine: ContinuousEngine, reference: PreTrainedModel, mixed_prompts: list[list[int]]
) -> None:
    """A grounded request alone, then `mixed_prompts` together beside a logprobs row that never speculates: every
    output token-identical to HF `generate`."""
    alone = self_repeating_prompt(reference, 0)
    assert run(engine, "alone", alone, greedy(30)).token_ids == hf_greedy(reference, frozenset(), alone, 30)
    requests = [EngineRequest(f"mixed-{i}", p, greedy(24)) for i, p in enumerate(mixed_prompts)]
    logprobs_row = dataclasses.replace(greedy(24), logprobs=1)
    requests.append(EngineRequest("with-logprobs", mixed_prompts[0], logprobs_row))
    collectors = submit_together(engine, requests)
    for prompt, collector in zip([*mixed_prompts, mixed_prompts[0]], collectors, strict=True):
        assert collector.token_ids == hf_greedy(reference, frozenset(), prompt, 24)


@pytest.mark.parametrize("method", ["ngram", "none"])
def test_greedy_output_is_identical_with_and_without_speculation(
    method: str,
    endless_runner: ModelRunner,
    tiny_config: Config,
    reference_model: PreTrainedModel,
    caplog: pytest.LogCaptureFixture,
) -> None:
    serving = serve(endless_runner, dataclasses.replace(tiny_config, speculative_method=method), caplog)
    engine = next(serving)
    prompts = [self_repeating_prompt(reference_model, i) for i in range(1, 4)]
    assert_greedy_matches_hf_alone_and_mixed(engine, reference_model, prompts)
    stats = engine.stats
    if method == "ngram":
        runs = [(self_repeating_prompt(reference_model, 0), 30), *((prompt, 24) for prompt in prompts)]
        agreements = [
            agreement
            for prompt, num_tokens in runs
            for agreement in lookup_agreements(prompt, hf_greedy(reference_model, frozenset(), prompt, num_tokens))
        ]
        assert agreements, "the model's own text gave prompt lookup nothing to propose"
        assert stats.num_proposed_tokens > 0 and stats.num_proposed_tokens >= stats.num_accepted_tokens
        assert (stats.num_accepted_tokens > 0) == any(agreements)
    else:
        assert stats.num_proposed_tokens == 0
    next(serving, None)


@pytest.mark.parametrize("method", ["ngram", "self"])
def test_a_request_overrides_the_workers_speculative_default(
    method: str,
    endless_runner: ModelRunner,
    tiny_config: Config,
    reference_model: PreTrainedModel,
    caplog: pytest.LogCaptureFixture,
) -> None:
    serving = serve(endless_runner, dataclasses.replace(tiny_config, speculative_method="none"), caplog)
    engine = next(serving)
    prompt = self_repeating_prompt(reference_model, 9)
    plain = run(engine, "default", prompt, greedy(20)).token_ids
    assert engine.stats.num_proposed_tokens == 0
    assert lookup_agreements(prompt, plain), "the model's own text gave prompt lookup nothing to propose"
    asking = dataclasses.replace(greedy(20), speculative_method=method, num_speculative_tokens=2)
    assert run(engine, "asking", prompt, asking).token_ids == plain
    assert engine.stats.num_proposed_tokens > 0
    assert engine.stats.num_proposed_tokens <= 2 * engine.stats.num_verifications
    next(serving, None)


def chi_square(counts: torch.Tensor, probs: torch.Tensor) -> float:
    expected = probs * counts.sum()
    return float(((counts - expected) ** 2 / expected).sum())


def test_rejection_sampling_keeps_the_targets_distribution() -> None:
    """Proposals drawn from nowhere near p (always 2, then 1) still yield tokens distributed as p at each position."""
    probs = torch.tensor([[0.1, 0.2, 0.3, 0.4], [0.4, 0.1, 0.2, 0.3], [0.25, 0.25, 0.25, 0.25]])
    generator = torch.Generator().manual_seed(0)
    first, second = torch.zeros(4), torch.zeros(4)
    for _ in range(20_000):
        tokens = verify_sampled(probs, [2, 1], generator)
        first[tokens[0]] += 1
        if tokens[0] == 2:  # the proposal was kept, so the second token was drawn at position 1
            second[tokens[1]] += 1
    critical = 16.27  # chi-square with 3 degrees of freedom at p = 0.001
    assert chi_square(first, probs[0]) < critical, first
    assert chi_square(second, probs[1]) < critical, second
    assert first[2] / first.sum() == pytest.approx(0.3, abs=0.02)  # not the 1.0 a proposal-biased rule would give


def test_unseeded_sampled_rows_speculate_and_seeded_ones_never_do(
    endless_runner: ModelRunner,
    tiny_config: Config,
    reference_model: PreTrainedModel,
    caplog: pytest.LogCaptureFixture,
) -> None:
    serving = serve(endless_runner, tiny_config, caplog)
    engine = next(serving)
    prompt = self_repeating_prompt(reference_model, 11)
    seeded = SamplingParams(max_tokens=24, temperature=0.7, seed=3)
    first = run(engine, "seeded", prompt, seeded).token_ids
    assert engine.stats.num_proposed_tokens == 0
    assert run(engine, "seeded-again", prompt, seeded).token_ids == first
    unseeded = dataclasses.replace(seeded, seed=None, temperature=0.3)  # close to the copying greedy path
    for attempt in range(4):  # a sampled token can leave every n-gram behind; four misses in a row are very unlikely
        assert len(run(engine, f"unseeded-{attempt}", prompt, unseeded).token_ids) == 24
    assert engine.stats.num_proposed_tokens > 0
    next(serving, None)
