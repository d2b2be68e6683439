"""Prompt logprobs from the prefill's own forward pass, across prefill chunks, against HF's forward of the prompt;
rows that ask for none are untouched, a prompt scored with max_tokens 0 generates nothing, and logit_bias moves
greedy picks."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Iterator

import pytest
import torch
from transformers import PreTrainedModel

from tasks.config import Config
from tasks.messages.generation import FinishReason, SamplingParams
from tests.worker.engine_harness import greedy, hf_greedy, run, serve, submit_together
from worker.engine.continuous_engine import ContinuousEngine
from worker.engine.interface import EngineRequest
from worker.engine.model_runner import ModelRunner

TOLERANCE = 1e-4
NUM_TOP = 3


@pytest.fixture
def chunked_engine(
    endless_runner: ModelRunner, tiny_config: Config, caplog: pytest.LogCaptureFixture
) -> Iterator[ContinuousEngine]:
    """Prefill chunks of 7 tokens, so a 40-token prompt takes six steps; the prefix cache on."""
    config = dataclasses.replace(
        tiny_config, prefill_chunk_size=7, max_num_batched_tokens=16, enable_prefix_caching=True
    )
    yield from serve(endless_runner, config, caplog)


def random_prompt(seed: int, length: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(5, 2000) for _ in range(length)]


def hf_prompt_logprobs(reference: PreTrainedModel, prompt: list[int]) -> torch.Tensor:
    """[L - 1, V]: HF's log_softmax at every prompt position but the last, each scoring the token after it."""
    with torch.no_grad():
        logits = reference(torch.tensor([prompt])).logits[0].float()
    return torch.log_softmax(logits, dim=-1)[:-1]


def check_against_hf(prompt_logprobs: tuple, reference: PreTrainedModel, prompt: list[int]) -> None:
    expected = hf_prompt_logprobs(reference, prompt)
    assert len(prompt_logprobs) == len(prompt)
    assert prompt_logprobs[0] is None
    for position, entry in enumerate(prompt_logprobs[1:]):
        row = expected[position]
        token_id = prompt[position + 1]
        assert entry.token_id == token_id
        assert entry.logprob == pytest.approx(row[token_id].item(), abs=TOLERANCE)
        # tokens within TOLERANCE of the prompt token's logprob may order either way in another summation order
        logprob = row[token_id]
        assert int((row > logprob + TOLERANCE).sum()) + 1 <= entry.rank <= int((row > logprob - TOLERANCE).sum()) + 1
        top_values, top_ids = row.topk(NUM_TOP)
        assert [token for token, _ in entry.top] == top_ids.tolist()
        assert [value for _, value in entry.top] == pytest.approx(top_values.tolist(), abs=TOLERANCE)


def test_prompt_logprobs_over_chunked_prefill_match_hf(
    chunked_engine: ContinuousEngine, reference_model: PreTrainedModel
) -> None:
    prompt = random_prompt(1, 40)
    sampling = SamplingParams(max_tokens=3, temperature=0.0, prompt_logprobs=NUM_TOP)
    collector = run(chunked_engine, "scored", prompt, sampling)
    first, *rest = collector.outputs
    check_against_hf(first.prompt_logprobs, reference_model, prompt)
    assert all(output.prompt_logprobs == () for output in rest)  # each prompt token reported once
    assert collector.token_ids == hf_greedy(reference_model, frozenset(), prompt, 3)


def test_a_cached_prefix_is_computed_again_for_prompt_logprobs(
    chunked_engine: ContinuousEngine, reference_model: PreTrainedModel
) -> None:
    """The first request caches the prompt's blocks; the second, asking for prompt logprobs, must score every
    position, so it takes none of them."""
    prompt = random_prompt(2, 40)
    run(chunked_engine, "warm", prompt, greedy(1))
    sampling = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=NUM_TOP)
    scored = run(chunked_engine, "scored", prompt, sampling)
    check_against_hf(scored.outputs[0].prompt_logprobs, reference_model, prompt)
    assert scored.outputs[-1].num_cached_tokens == 0
    plain = run(chunked_engine, "plain", prompt, greedy(1))
    assert plain.outputs[-1].num_cached_tokens > 0  # others still reuse it


def test_rows_without_prompt_logprobs_are_unaffected(
    chunked_engine: ContinuousEngine, reference_model: PreTrainedModel
) -> None:
    prompts = [random_prompt(seed, 20 + 5 * seed) for seed in range(4)]
    requests = [
        EngineRequest(
            f"r{i}", prompt, SamplingParams(max_tokens=4, temperature=0.0, prompt_logprobs=NUM_TOP if i % 2 else None)
        )
        for i, prompt in enumerate(prompts)
    ]
    collectors = submit_together(chunked_engine, requests)
    for i, (prompt, collector) in enumerate(zip(prompts, collectors, strict=True)):
        assert collector.token_ids == hf_greedy(reference_model, frozenset(), prompt, 4)
        if i % 2:
            check_against_hf(collector.outputs[0].prompt_logprobs, reference_model, prompt)
        else:
            assert all(output.prompt_logprobs == () for output in collector.outputs)


def test_max_tokens_0_scores_the_prompt_and_generates_nothing(
    chunked_engine: ContinuousEngine, reference_model: PreTrainedModel
) -> None:
    prompt = random_prompt(3, 30)
    sampling = SamplingParams(max_tokens=0, temperature=0.0, logprobs=1, prompt_logprobs=NUM_TOP)
    collector = run(chunked_engine, "score-only", prompt, sampling)
    (output,) = collector.outputs
    assert output.new_token_ids == [] and output.logprobs == ()
    assert output.finish_reason == FinishReason.LENGTH
    check_against_hf(output.prompt_logprobs, reference_model, prompt)


def test_logit_bias_moves_the_greedy_pick(chunked_engine: ContinuousEngine, reference_model: PreTrainedModel) -> None:
    prompt = random_prompt(4, 12)
    natural = hf_greedy(reference_model, frozenset(), prompt, 1)[0]
    favoured = 1234 if natural != 1234 else 1235
    boosted = run(
        chunked_engine, "boost", prompt, SamplingParams(max_tokens=1, temperature=0.0, logit_bias=((favoured, 100.0),))
    )
    assert boosted.token_ids == [favoured]
    banned = SamplingParams(max_tokens=1, temperature=0.0, logit_bias=((natural, -100.0),))
    assert run(chunked_engine, "ban", prompt, banned).token_ids != [natural]
