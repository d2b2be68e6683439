"""The continuous engine under load: staggered arrivals, chunked prefill, preemption, and per-request sampling
parameters, always against HF `generate` and the KV pool's free count."""

from __future__ import annotations

import dataclasses
import random
import threading
import time
from collections.abc import Iterator

import pytest
import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from tasks.config import Config
from tasks.messages.generation import FinishReason, SamplingParams
from tests.worker.engine_harness import TIMEOUT_S, Collector, greedy, hf_greedy, run, serve
from worker.engine.continuous_engine import ContinuousEngine
from worker.engine.interface import BULK_PRIORITY, EngineRequest
from worker.engine.model_runner import ModelRunner

NUM_REQUESTS = 32


def random_prompts(num: int, seed: int, lengths: tuple[int, int]) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(5, 2000) for _ in range(rng.randint(*lengths))] for _ in range(num)]


def submit_staggered(engine: ContinuousEngine, requests: list[EngineRequest], max_gap_s: float) -> list[Collector]:
    """Submits the requests one by one from another thread, with random gaps, while earlier ones run."""
    collectors = [Collector() for _ in requests]
    rng = random.Random(7)

    def feed() -> None:
        for request, collector in zip(requests, collectors, strict=True):
            engine.submit(request, collector)
            time.sleep(rng.uniform(0, max_gap_s))

    feeder = threading.Thread(target=feed)
    feeder.start()
    feeder.join(TIMEOUT_S)
    for collector in collectors:
        collector.wait()
    return collectors


@pytest.fixture
def chunked_engine(
    endless_runner: ModelRunner, tiny_config: Config, caplog: pytest.LogCaptureFixture
) -> Iterator[ContinuousEngine]:
    """Small prefill chunks and token budget, so long prompts span several steps beside running decodes."""
    config = dataclasses.replace(tiny_config, prefill_chunk_size=24, max_num_batched_tokens=64)
    yield from serve(endless_runner, config, caplog)


def test_32_staggered_requests_match_hf_generate_token_for_token(
    chunked_engine: ContinuousEngine, endless_runner: ModelRunner, reference_model: PreTrainedModel
) -> None:
    prompts = random_prompts(NUM_REQUESTS, seed=1, lengths=(4, 90))
    max_tokens = [random.Random(i).randint(8, 24) for i in range(NUM_REQUESTS)]
    requests = [EngineRequest(f"staggered-{i}", prompt, greedy(max_tokens[i])) for i, prompt in enumerate(prompts)]
    collectors = submit_staggered(chunked_engine, requests, max_gap_s=0.01)

    for prompt, num_max, collector in zip(prompts, max_tokens, collectors, strict=True):
        assert collector.outputs[-1].finish_reason is FinishReason.LENGTH
        assert collector.token_ids == hf_greedy(reference_model, frozenset(), prompt, num_max)
    stats = chunked_engine.stats
    assert stats.max_batch_size_seen > 4
    # every prompt token and every output but the last went through the model exactly once, plus the proposed
    # tokens that speculative decoding computed and then rejected
    num_computed = sum(len(prompt) + num_max - 1 for prompt, num_max in zip(prompts, max_tokens, strict=True))
    num_rejected = stats.num_proposed_tokens - stats.num_accepted_tokens
    assert stats.num_prefill_tokens + stats.num_decode_tokens == num_computed + num_rejected


def test_a_long_prompt_is_prefilled_in_chunks_while_decodes_go_on(
    chunked_engine: ContinuousEngine, endless_runner: ModelRunner, reference_model: PreTrainedModel
) -> None:
    decoding = Collector()
    chunked_engine.submit(EngineRequest("decoding", [5, 6, 7], greedy(40)), decoding)
    while len(decoding.outputs) < 3:
        time.sleep(0.001)
    long_prompt = random_prompts(1, seed=3, lengths=(200, 200))[0]
    num_before = len(decoding.outputs)
    long_request = run(chunked_engine, "long", long_prompt, greedy(4))
    assert long_request.token_ids == hf_greedy(reference_model, frozenset(), long_prompt, 4)
    # 200 tokens in chunks of 24: at least 9 steps, each of which also decoded the running request
    assert len(decoding.outputs) - num_before >= 8
    decoding.wait()


@pytest.fixture
def tiny_pool_engine(
    endless_runner: ModelRunner, tiny_config: Config, caplog: pytest.LogCaptureFixture
) -> Iterator[ContinuousEngine]:
    """A pool of 12 blocks of 16 tokens: six requests of ~60 tokens cannot all hold their blocks at once."""
    runner = ModelRunner(dataclasses.replace(tiny_config, kv_cache_tokens=12 * 16))
    runner.eos_token_ids = endless_runner.eos_token_ids
    yield from serve(runner, tiny_config, caplog)


def test_preemption_recomputes_and_still_matches_hf_generate(
    tiny_pool_engine: ContinuousEngine, reference_model: PreTrainedModel
) -> None:
    prompts = random_prompts(6, seed=2, lengths=(20, 40))
    requests = [EngineRequest(f"preempted-{i}", prompt, greedy(24)) for i, prompt in enumerate(prompts)]
    collectors = submit_staggered(tiny_pool_engine, requests, max_gap_s=0.0)
    for prompt, collector in zip(prompts, collectors, strict=True):
        assert collector.token_ids == hf_greedy(reference_model, frozenset(), prompt, 24)
    assert tiny_pool_engine.stats.num_preemptions > 0
    assert tiny_pool_engine.num_free_blocks == tiny_pool_engine.num_blocks


def test_a_request_larger_than_the_pool_is_refused(tiny_pool_engine: ContinuousEngine) -> None:
    refused = run(tiny_pool_engine, "huge", [5] * 150, greedy(100))
    assert refused.outputs[-1].error is not None and "KV cache" in refused.outputs[-1].error
    assert refused.outputs[-1].is_request_error


def test_interactive_requests_overtake_bulk_ones(
    endless_runner: ModelRunner, tiny_config: Config, caplog: pytest.LogCaptureFixture
) -> None:
    config = dataclasses.replace(tiny_config, max_num_seqs=2)
    engine = next(serve_iter := serve(endless_runner, config, caplog))
    bulk = [Collector() for _ in range(4)]
    for i, collector in enumerate(bulk):
        engine.submit(EngineRequest(f"bulk-{i}", [5, 6, 7], greedy(60), priority=BULK_PRIORITY), collector)
    while len(bulk[0].outputs) < 2:
        time.sleep(0.001)
    chat = run(engine, "chat", [8, 9], greedy(3))
    assert chat.outputs[-1].finish_reason is FinishReason.LENGTH
    assert not any(collector.finished.is_set() for collector in bulk), "chat waited for a bulk request to end"
    for collector in bulk:
        collector.wait()
    assert engine.stats.num_preemptions >= 1
    next(serve_iter, None)


def test_min_tokens_holds_off_eos(engine: ContinuousEngine, runner: ModelRunner, tokenizer) -> None:
    prompt = tokenizer.encode("The quick brown fox")
    natural = run(engine, "natural", prompt, greedy(64))
    assert natural.outputs[-1].finish_reason is FinishReason.STOP
    num_natural = len(natural.token_ids)
    held = run(engine, "held", prompt, dataclasses.replace(greedy(64), min_tokens=num_natural + 5))
    assert len(held.token_ids) > num_natural + 5
    assert not set(held.token_ids[: num_natural + 5]) & runner.eos_token_ids


def test_logprobs_are_the_models_and_greedy_picks_the_top_one(
    engine: ContinuousEngine, reference_model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase
) -> None:
    prompt = tokenizer.encode("Once upon a time")
    collector = run(engine, "logprobs", prompt, dataclasses.replace(greedy(5), logprobs=3))
    logprobs = [entry for output in collector.outputs for entry in output.logprobs]
    assert [entry.token_id for entry in logprobs] == collector.token_ids
    with torch.no_grad():
        first = reference_model(torch.tensor([prompt])).logits[0, -1].log_softmax(-1)
    assert logprobs[0].logprob == pytest.approx(float(first[collector.token_ids[0]]), abs=1e-4)
    for entry in logprobs:
        assert len(entry.top) == 3
        assert entry.top[0][0] == entry.token_id
        assert entry.top[0][1] >= entry.top[1][1] >= entry.top[2][1]


def test_penalties_change_greedy_output_and_stay_deterministic(
    endless_engine: ContinuousEngine, tokenizer: PreTrainedTokenizerBase
) -> None:
    prompt = tokenizer.encode("one two three one two three one two")
    plain = run(endless_engine, "plain", prompt, greedy(30)).token_ids
    penalized_params = dataclasses.replace(greedy(30), frequency_penalty=2.0, repetition_penalty=1.5)
    penalized = run(endless_engine, "penalized", prompt, penalized_params).token_ids
    assert penalized != plain
    assert len(set(penalized)) > len(set(plain))
    assert run(endless_engine, "penalized-again", prompt, penalized_params).token_ids == penalized


def test_seeded_top_k_sampling_stays_within_k_and_ignores_batch_mates(
    endless_engine: ContinuousEngine, reference_model: PreTrainedModel
) -> None:
    prompt = [5, 6, 7, 8]
    params = SamplingParams(max_tokens=12, temperature=1.5, top_k=2, seed=42, logprobs=2)
    alone = run(endless_engine, "top-k-alone", prompt, params)
    for entry in [e for output in alone.outputs for e in output.logprobs]:
        assert entry.token_id in {token_id for token_id, _ in entry.top}
    crowd = [Collector() for _ in range(5)]
    for i, collector in enumerate(crowd):
        endless_engine.submit(
            EngineRequest(f"mate-{i}", [9 + i] * (3 + i), dataclasses.replace(params, seed=i)), collector
        )
    in_batch = run(endless_engine, "top-k-in-batch", prompt, params)
    assert in_batch.token_ids == alone.token_ids
    for collector in crowd:
        collector.wait()
