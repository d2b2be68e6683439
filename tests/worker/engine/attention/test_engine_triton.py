"""The engine with ATTENTION_BACKEND=triton (on CPU: the kernels under Triton's interpreter) decodes greedily what the
default path and HF `generate` do, over chunked prefill, prefix-cache hits and speculative verify chunks."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import pytest
from transformers import PreTrainedModel

from scheduler.batch import ScheduledChunk
from tasks.config import Config
from tests.worker.engine_harness import greedy, hf_greedy, load_runner, serve, submit_together
from worker.engine.attention import triton_step
from worker.engine.attention.backend import AttentionBackend
from worker.engine.continuous_engine import ContinuousEngine
from worker.engine.interface import EngineRequest
from worker.engine.model_runner import ModelRunner

PREFIX = list(range(40, 70))  # two prompts share it: the second finds its full blocks in the prefix cache
PASSAGE = [17, 900, 33, 1500, 250, 61, 1203, 77, 412, 5, 880, 1999]
PROMPTS = [[*PREFIX, 7, 8, 9], [*PREFIX, 11, 12], PASSAGE + PASSAGE[:4], [300]]
MAX_TOKENS = 10


@pytest.fixture(scope="module")
def triton_config(tiny_config: Config) -> Config:
    return dataclasses.replace(tiny_config, attention_backend="triton", prefill_chunk_size=16)  # prompts in chunks


@pytest.fixture(scope="module")
def triton_runner(triton_config: Config) -> ModelRunner:
    return load_runner(triton_config, stops_at_eos=False)


@pytest.fixture
def triton_engine(
    triton_runner: ModelRunner, triton_config: Config, caplog: pytest.LogCaptureFixture
) -> Iterator[ContinuousEngine]:
    yield from serve(triton_runner, triton_config, caplog)


def greedy_outputs(engine: ContinuousEngine, prompts: list[list[int]]) -> list[list[int]]:
    # self-drafting proposes tokens at every step whatever the model writes, so verify chunks (k + 1 tokens at a
    # position off the block boundaries) go through the kernels; greedy output stays exactly the model's own
    sampling = dataclasses.replace(greedy(MAX_TOKENS), speculative_method="self")
    requests = [EngineRequest(f"req-{i}", prompt, sampling) for i, prompt in enumerate(prompts)]
    return [collector.token_ids for collector in submit_together(engine, requests)]


def test_triton_engine_decodes_as_the_default_path_and_hf(
    triton_runner: ModelRunner,
    triton_engine: ContinuousEngine,
    endless_engine: ContinuousEngine,
    reference_model: PreTrainedModel,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    spans: set[tuple[int, int]] = set()  # (start, tokens) of every chunk the kernels attended to

    def spied(chunks: list[ScheduledChunk], *args: object) -> triton_step.TritonStep:
        spans.update((chunk.start, chunk.num_tokens) for chunk in chunks)
        return build(chunks, *args)

    build = triton_step.build_triton_step
    monkeypatch.setattr(triton_step, "build_triton_step", spied)
    assert triton_runner.attention_backend is AttentionBackend.TRITON
    assert triton_runner.kv_pool.decode_kernel is None  # every row through the Triton kernels
    first, rest = greedy_outputs(triton_engine, PROMPTS[:1]), greedy_outputs(triton_engine, PROMPTS[1:])
    triton_tokens = first + rest  # the first alone, so that the second's prefix is cached when it comes
    default_tokens = greedy_outputs(endless_engine, PROMPTS)
    assert triton_tokens == default_tokens
    assert triton_tokens == [hf_greedy(reference_model, frozenset(), prompt, MAX_TOKENS) for prompt in PROMPTS]
    assert {(0, 16), (16, 16), (32, 1)} <= spans  # the first prompt in chunks of 16
    assert (16, 16) in spans  # the second's first chunk after its cached block
    assert any(start > 0 and num_tokens > 1 and start % 16 for start, num_tokens in spans)  # verify chunks
