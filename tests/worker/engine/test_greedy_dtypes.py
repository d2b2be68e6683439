"""Greedy decoding equals HF `generate` in float32, and in bfloat16 on cases checked tolerance-free in float32 first:
a prompt, extended by its float32 greedy tokens up to the longest run of steps whose top logit leads the runner-up
by at least MARGIN, and that run's length to generate, so that bfloat16's rounding cannot flip a token. On CUDA
(`gpu` marker) through the worker's default path there (the Triton kernels, decode steps in CUDA graphs); on CPU
through its default path."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from transformers import AutoModelForCausalLM, PreTrainedModel, PreTrainedTokenizerBase

from tasks.config import Config
from tests.worker.engine_harness import greedy, hf_greedy, load_runner, serve, submit_together
from worker.engine.interface import EngineRequest

DEVICES = [
    "cpu",
    pytest.param(
        "cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]
    ),
]
QUESTIONS = [
    "tell me about dogs",
    "what is 3 plus 4?",
    "tell me a story",
    "what is the capital of Peru?",
    "tell me about cats",
    "Tell me about horses.",
]
MAX_TOKENS = 12
MARGIN = 1.0  # logits; bfloat16 moves the tiny model's logits by a few hundredths
SEARCH_TOKENS = 24  # the float32 continuation searched for a clear run
MIN_RUN, MIN_CASES = 4, 4


@pytest.fixture(scope="module")
def prompts(tokenizer: PreTrainedTokenizerBase) -> list[list[int]]:
    chats = [[{"role": "user", "content": question}] for question in QUESTIONS]
    return [list(tokenizer.apply_chat_template(chat, add_generation_prompt=True)["input_ids"]) for chat in chats]


def reference(config: Config, dtype: torch.dtype) -> PreTrainedModel:
    return AutoModelForCausalLM.from_pretrained(config.model, dtype=dtype).to(config.device).eval()


def greedy_margins(model: PreTrainedModel, prompt: list[int]) -> tuple[list[int], list[float]]:
    """The greedy continuation (EOS not stopping it) and, per step, the top logit's lead over the runner-up."""
    input_ids = torch.tensor([prompt], device=model.device)
    output = model.generate(
        input_ids,
        attention_mask=torch.ones_like(input_ids),
        do_sample=False,
        max_new_tokens=SEARCH_TOKENS,
        eos_token_id=[],
        output_scores=True,
        return_dict_in_generate=True,
    )
    top_two = torch.stack([scores[0].float().topk(2).values for scores in output.scores])  # [steps, 2]
    return output.sequences[0, len(prompt) :].tolist(), (top_two[:, 0] - top_two[:, 1]).tolist()


def clear_case(model: PreTrainedModel, prompt: list[int]) -> tuple[list[int], int]:
    """The prompt extended to the start of its continuation's longest run of clear steps, and that run's length."""
    tokens, margins = greedy_margins(model, prompt)
    best_start, best_length, start = 0, 0, 0
    for step, margin in enumerate([*margins, 0.0]):
        if margin < MARGIN:
            if step - start > best_length:
                best_start, best_length = start, step - start
            start = step + 1
    return prompt + tokens[:best_start], best_length


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
    cases = [case for case in (clear_case(float32_model, prompt) for prompt in prompts) if case[1] >= MIN_RUN]
    assert len(cases) >= MIN_CASES, "too few clear runs in float32 to compare bfloat16 on"
    extended, lengths = [prompt for prompt, _ in cases], [length for _, length in cases]
    float32_tokens = [hf_greedy(float32_model, frozenset(), p, n) for p, n in cases]
    bfloat16_model = reference(config, torch.bfloat16)
    expected = [hf_greedy(bfloat16_model, frozenset(), p, n) for p, n in cases]
    assert expected == float32_tokens  # the margins held under HF's own bfloat16
    assert engine_greedy(config, extended, lengths, caplog) == expected
