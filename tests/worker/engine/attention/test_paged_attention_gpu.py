"""The CUDA attention backends in the engine, against HF's own attention (skipped without a GPU; flash-attn's also
without flash-attn). The Triton kernels alone against SDPA on CUDA: tests/worker/kernels/test_triton_attention.py."""

from __future__ import annotations

import dataclasses
import importlib.util
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, PreTrainedModel

from scheduler.request import Request
from scheduler.scheduler import Scheduler
from tasks.config import Config
from tests.worker.engine_harness import greedy, hf_greedy, load_runner, serve, submit_together
from worker.engine.attention.backend import AttentionBackend
from worker.engine.continuous_engine import ContinuousEngine, scheduler_config
from worker.engine.interface import EngineRequest
from worker.engine.model_runner import ModelRunner

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]
BACKENDS = [
    pytest.param(
        "flash_attn",
        marks=pytest.mark.skipif(importlib.util.find_spec("flash_attn") is None, reason="needs flash-attn"),
    ),
    "triton",
]
PROMPTS = [list(range(5, 5 + n)) for n in (3, 150, 40)]  # 150: three prefill chunks of 64


@pytest.mark.parametrize("backend", BACKENDS)
def test_paged_logits_match_hf_over_chunked_prefill_and_decode(tiny_model_dir: Path, backend: str) -> None:
    config = Config(
        model=str(tiny_model_dir),
        device="cuda",
        dtype="bfloat16",
        kv_cache_tokens=8192,
        prefill_chunk_size=64,
        attention_backend=backend,
    )
    runner = ModelRunner(config)
    assert runner.attention_backend is AttentionBackend(backend)
    reference = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.bfloat16).to("cuda").eval()
    scheduler = Scheduler(scheduler_config(config, runner))
    for i, prompt in enumerate(PROMPTS):
        scheduler.add(Request(f"r{i}", prompt, max_tokens=6))
    while scheduler.has_work:
        batch = scheduler.schedule()
        logits = runner.run(batch).logits
        for chunk, row_logits in zip(batch.sampling_chunks, logits, strict=True):
            sequence = chunk.request.prompt_token_ids + chunk.request.output_token_ids
            with torch.no_grad():
                expected = reference(torch.tensor([sequence], device="cuda")).logits[0, -1].float()
            torch.testing.assert_close(row_logits, expected, atol=0.1, rtol=0.05)
        scheduler.update_from_output(batch, [[token] for token in logits.argmax(-1).tolist()])


@pytest.fixture(scope="module")
def float32_triton_config(tiny_config: Config) -> Config:
    return dataclasses.replace(
        tiny_config, device="cuda", dtype="float32", attention_backend="triton", prefill_chunk_size=64
    )


@pytest.fixture
def float32_triton_engine(
    float32_triton_config: Config, caplog: pytest.LogCaptureFixture
) -> Iterator[ContinuousEngine]:
    runner = load_runner(float32_triton_config, stops_at_eos=False)
    assert runner.attention_backend is AttentionBackend.TRITON
    yield from serve(runner, float32_triton_config, caplog)


def test_triton_engine_greedy_equals_hf_generate_in_float32(
    float32_triton_engine: ContinuousEngine, tiny_model_dir: Path
) -> None:
    reference: PreTrainedModel = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    reference = reference.to("cuda").eval()
    requests = [EngineRequest(f"req-{i}", prompt, greedy(24)) for i, prompt in enumerate(PROMPTS)]
    collectors = submit_together(float32_triton_engine, requests)
    for prompt, collector in zip(PROMPTS, collectors, strict=True):
        assert collector.token_ids == hf_greedy(reference, frozenset(), prompt, 24)
