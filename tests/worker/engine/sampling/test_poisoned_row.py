"""A row whose sampling raises ends its own request with an error; every other row of the step gets the tokens it
would have had alone, and the engine goes on."""

from __future__ import annotations

import pytest

from tasks.messages.generation import SamplingParams
from tests.worker.engine.test_engine_batching import random_prompts
from tests.worker.engine_harness import greedy, run, submit_together, take_logged_errors
from worker.engine.continuous_engine import ContinuousEngine
from worker.engine.interface import EngineRequest

POISON = SamplingParams(max_tokens=8, temperature=1.0, top_k=10**30)  # overflows the sampler's batched tensor


def test_a_poisoned_row_fails_alone_and_its_step_mates_match_their_solo_runs(
    endless_engine: ContinuousEngine, caplog: pytest.LogCaptureFixture
) -> None:
    engine = endless_engine
    prompts = random_prompts(4, seed=3, lengths=(5, 20))
    solo = [run(engine, f"solo-{i}", prompt, greedy(12)).token_ids for i, prompt in enumerate(prompts)]
    seeded = SamplingParams(max_tokens=12, temperature=1.0, seed=5)
    solo_seeded = run(engine, "solo-seeded", prompts[0], seeded).token_ids

    requests = [EngineRequest(f"mate-{i}", prompt, greedy(12)) for i, prompt in enumerate(prompts)]
    requests += [EngineRequest("seeded", prompts[0], seeded), EngineRequest("poisoned", prompts[1], POISON)]
    collectors = submit_together(engine, requests)

    *mates, seeded_mate, poisoned = collectors
    assert [collector.token_ids for collector in mates] == solo
    assert seeded_mate.token_ids == solo_seeded
    assert poisoned.outputs[-1].error is not None and "sampling failed" in poisoned.outputs[-1].error
    assert all(collector.outputs[-1].error is None for collector in mates)
    assert any("sampling each row alone" in message for message in take_logged_errors(caplog))
    assert run(engine, "after", prompts[2], greedy(12)).token_ids == solo[2], "the engine goes on"
