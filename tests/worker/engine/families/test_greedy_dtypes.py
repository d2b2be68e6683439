"""Greedy decoding equals HF `generate` in float32, and in bfloat16 on cases checked tolerance-free in float32 first
(tests/worker/greedy_cases.py), so that bfloat16's rounding cannot flip a token. On CUDA (`gpu` marker) through the
worker's default path there (the Triton kernels, decode steps in CUDA graphs); on CPU through its default path."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from transformers import AutoModelForCausalLM, PreTrainedModel, PreTrainedTokenizerBase

from tasks.config import Config
from tests.worker.engine_harness import greedy, hf_greedy, load_runner, serve, submit_together
from tests.worker.greedy_cases import chat_prompts, clear_cases
from worker.engine.interface import EngineRequest

DEVICES = [
    "cpu",
    pytest.param(
        "cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]
    ),
]
MAX_TOKENS = 12
MIN_CASES = 4


@pytest.fixture(scope="module")
def prompts(tokenizer: PreTrainedTokenizerBase) -> list[list[int]]:
    return chat_prompts(tokenizer)


def reference(config: Config, dtype: torch.dtype) -> PreTrainedModel:
    return AutoModelForCausalLM.from_pretrained(config.model, dtype=dtype).to(config.device).eval()


def engine_greedy(
    config: Config, prompts: list[list[int]], lengths: list[int], caplog: pytest.LogCaptureFixture
) -> list[list[int]]:
    serving = serve(load_runner(config, stops_at_eos=False), config, caplog)
    engine = next(serving)
    requests = [
        EngineRequest(f"req-{i}", prompt, greedy(length))
        for i, (prompt, length) in enumerate(zip(prompts, lengths, strict=True))
    ]
    tokens = [collector.token_ids for collector in submit_together(engine, requests)]
    next(serving, None)
    return tokens


@pytest.mark.parametrize("device", DEVICES)
def test_float32_greedy_equals_hf_generate(
    device: str, tiny_config: Config, prompts: list[list[int]], caplog: pytest.LogCaptureFixture
) -> None:
    config = dataclasses.replace(tiny_config, device=device, dtype="float32")
    model = reference(config, torch.float32)
    expected = [hf_greedy(model, frozenset(), prompt, MAX_TOKENS) for prompt in prompts]
    assert engine_greedy(config, prompts, [MAX_TOKENS] * len(prompts), caplog) == expected


@pytest.mark.parametrize("device", DEVICES)
def test_bfloat16_greedy_equals_hf_generate_where_float32_leads_clearly(
    device: str, tiny_config: Config, prompts: list[list[int]], caplog: pytest.LogCaptureFixture
) -> None:
    config = dataclasses.replace(tiny_config, device=device, dtype="bfloat16")
    float32_model = reference(config, torch.float32)
    cases = clear_cases(float32_model, prompts)
    assert len(cases) >= MIN_CASES, "too few clear runs in float32 to compare bfloat16 on"
    extended, lengths = [prompt for prompt, _ in cases], [length for _, length in cases]
    float32_tokens = [hf_greedy(float32_model, frozenset(), p, n) for p, n in cases]
    bfloat16_model = reference(config, torch.bfloat16)
    expected = [hf_greedy(bfloat16_model, frozenset(), p, n) for p, n in cases]
    assert expected == float32_tokens  # the margins held under HF's own bfloat16
    assert engine_greedy(config, extended, lengths, caplog) == expected
