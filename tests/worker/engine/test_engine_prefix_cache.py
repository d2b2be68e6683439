"""The prefix cache in the running engine: greedy output is the same with it on or off, and requests that share a
prompt prefix report the tokens it served."""

from __future__ import annotations

import dataclasses
import random

import pytest
from transformers import PreTrainedModel

from tasks.config import Config
from tests.worker.engine_harness import greedy, hf_greedy, run, serve, submit_together
from worker.engine.interface import EngineRequest
from worker.engine.model_runner import ModelRunner

SYSTEM = [random.Random(5).randrange(5, 2000) for _ in range(100)]  # six full blocks of 16, and some


def turns(num: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[*SYSTEM, *(rng.randrange(5, 2000) for _ in range(rng.randint(3, 20)))] for _ in range(num)]


@pytest.mark.parametrize("is_caching", [True, False], ids=["cache-on", "cache-off"])
def test_shared_system_prompt_outputs_match_hf_with_the_cache_on_or_off(
    is_caching: bool,
    endless_runner: ModelRunner,
    tiny_config: Config,
    reference_model: PreTrainedModel,
    caplog: pytest.LogCaptureFixture,
) -> None:
    config = dataclasses.replace(tiny_config, enable_prefix_caching=is_caching)
    serving = serve(endless_runner, config, caplog)
    engine = next(serving)
    first = run(engine, "warm", turns(1, seed=0)[0], greedy(6))
    assert first.outputs[-1].num_cached_tokens == 0
    prompts = turns(6, seed=1)
    collectors = submit_together(engine, [EngineRequest(f"turn-{i}", p, greedy(8)) for i, p in enumerate(prompts)])
    for prompt, collector in zip(prompts, collectors, strict=True):
        assert collector.token_ids == hf_greedy(reference_model, frozenset(), prompt, 8)
    cached = [collector.outputs[-1].num_cached_tokens for collector in collectors]
    assert cached == [96 if is_caching else 0] * len(prompts)  # the system prompt's six full blocks
    next(serving, None)  # stops the engine and checks no block leaked
