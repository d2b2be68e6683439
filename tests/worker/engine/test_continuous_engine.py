"""ContinuousEngine against HF `generate` on the tiny model.

The tiny model is trained and ends most replies within a few tokens, so tests that need long generations use an
"endless" runner whose EOS set is empty; their HF reference then runs with EOS disabled too.
"""

from __future__ import annotations

import dataclasses
import threading

import pytest
import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from tasks.config import Config
from tasks.messages.generation import FinishReason, SamplingParams
from tests.worker.engine_harness import (
    SHORT_MAX_MODEL_LEN,
    TIMEOUT_S,
    Collector,
    greedy,
    hf_greedy,
    run,
    submit_together,
    take_logged_errors,
)
from worker.engine.continuous_engine import ContinuousEngine
from worker.engine.interface import EngineOutput, EngineRequest
from worker.engine.model_runner import ModelRunner

PROMPTS = [
    "The quick brown fox",
    "Once",
    "héllo 日本 🙂 one two three four five",
    "a small model that liked to count",
    "lazy dogs. The",  # each prompt tokenizes to its own length, so rows of one batch differ
    "Once upon a time there was a small model",
]


@pytest.mark.parametrize(
    "engine_name", ["engine", "endless_engine", "gather_endless_engine", "compiled_endless_engine"]
)
def test_single_greedy_request_matches_hf_generate(
    engine_name: str,
    request: pytest.FixtureRequest,
    tokenizer: PreTrainedTokenizerBase,
    reference_model: PreTrainedModel,
) -> None:
    engine = request.getfixturevalue(engine_name)
    runner = request.getfixturevalue(engine_name.replace("engine", "runner"))
    prompt = tokenizer.encode(PROMPTS[0])
    collector = run(engine, "solo", prompt, greedy(40))
    assert collector.token_ids == hf_greedy(reference_model, runner.eos_token_ids, prompt, 40)
    assert all(output.new_token_ids for output in collector.outputs)  # several when proposed tokens were accepted
    assert [output.is_finished for output in collector.outputs].count(True) == 1


@pytest.mark.parametrize(
    "engine_name", ["engine", "endless_engine", "gather_endless_engine", "compiled_endless_engine"]
)
def test_concurrent_requests_share_batches_and_match_solo_greedy(
    engine_name: str,
    request: pytest.FixtureRequest,
    tokenizer: PreTrainedTokenizerBase,
    reference_model: PreTrainedModel,
) -> None:
    engine = request.getfixturevalue(engine_name)
    runner = request.getfixturevalue(engine_name.replace("engine", "runner"))
    prompts = [tokenizer.encode(text) for text in PROMPTS]
    assert len({len(prompt) for prompt in prompts}) == len(prompts)
    max_tokens = [10 + 5 * index for index in range(len(prompts))]
    requests = [
        EngineRequest(f"req-{index}", prompt, greedy(max_tokens[index])) for index, prompt in enumerate(prompts)
    ]
    collectors = submit_together(engine, requests)

    for prompt, num_max, collector in zip(prompts, max_tokens, collectors, strict=True):
        final = collector.outputs[-1]
        assert final.error is None
        assert collector.token_ids == hf_greedy(reference_model, runner.eos_token_ids, prompt, num_max)
        if final.finish_reason is FinishReason.LENGTH:
            assert len(collector.token_ids) == num_max
        else:
            assert final.finish_reason is FinishReason.STOP
            assert collector.token_ids[-1] in runner.eos_token_ids
    stats = engine.stats
    assert stats.max_batch_size_seen > 1
    if not runner.eos_token_ids:
        assert all(collector.outputs[-1].finish_reason is FinishReason.LENGTH for collector in collectors)
        assert len(stats.batch_size_histogram) > 2  # the batch shrank as rows finished


def test_cancel_aborts_at_the_next_step(endless_engine: ContinuousEngine, tokenizer: PreTrainedTokenizerBase) -> None:
    reached_two_tokens, cancelled = threading.Event(), threading.Event()
    collector = Collector()

    def on_output(output: EngineOutput) -> None:
        collector(output)
        if len(collector.outputs) == 2:
            reached_two_tokens.set()
            cancelled.wait(TIMEOUT_S)

    prompt = tokenizer.encode(PROMPTS[1])
    endless_engine.submit(EngineRequest("to-cancel", prompt, greedy(40)), on_output)
    assert reached_two_tokens.wait(TIMEOUT_S)
    endless_engine.cancel("to-cancel")
    cancelled.set()
    final = collector.wait()
    assert final == EngineOutput("to-cancel", [], FinishReason.ABORT)
    assert len(collector.outputs) == 3


def test_cancel_before_the_first_step_aborts_with_no_tokens(runner: ModelRunner, tiny_config: Config) -> None:
    engine = ContinuousEngine(runner, tiny_config)
    collector = Collector()
    engine.submit(EngineRequest("early", [5, 6, 7], greedy(5)), collector)
    engine.cancel("early")
    engine.start()
    try:
        assert collector.wait() == EngineOutput("early", [], FinishReason.ABORT)
    finally:
        engine.stop(timeout_s=TIMEOUT_S)


def test_seeded_sampling_is_reproducible_alone_and_in_a_batch(
    endless_engine: ContinuousEngine, tokenizer: PreTrainedTokenizerBase
) -> None:
    prompt = tokenizer.encode(PROMPTS[2])
    seeded = SamplingParams(max_tokens=16, temperature=1.2, top_p=0.95, seed=1234)
    first = run(endless_engine, "seeded-1", prompt, seeded).token_ids
    assert run(endless_engine, "seeded-2", prompt, seeded).token_ids == first
    other_seed = run(endless_engine, "seeded-3", prompt, dataclasses.replace(seeded, seed=99)).token_ids
    assert other_seed != first

    unseeded = dataclasses.replace(seeded, seed=None)
    crowd = [EngineRequest(f"crowd-{index}", tokenizer.encode(text), unseeded) for index, text in enumerate(PROMPTS)]
    crowd.insert(2, EngineRequest("seeded-in-batch", prompt, seeded))
    collectors = submit_together(endless_engine, crowd)
    assert collectors[2].token_ids == first
    assert endless_engine.stats.max_batch_size_seen > 1


def test_prompt_over_max_model_len_gets_an_error(short_engine: ContinuousEngine) -> None:
    too_long = run(short_engine, "too-long", [5] * SHORT_MAX_MODEL_LEN, greedy(4))
    assert too_long.token_ids == []
    assert too_long.outputs[-1].error is not None and "prompt" in too_long.outputs[-1].error
    just_fits = run(short_engine, "just-fits", [5] * (SHORT_MAX_MODEL_LEN - 1), greedy(4))
    assert len(just_fits.token_ids) == 1
    assert just_fits.outputs[-1].finish_reason is FinishReason.LENGTH


def test_generation_stops_at_max_model_len(short_engine: ContinuousEngine) -> None:
    collector = run(short_engine, "short-context", [5, 6, 7, 8, 9], greedy(100))
    assert collector.outputs[-1].finish_reason is FinishReason.LENGTH
    assert len(collector.token_ids) == SHORT_MAX_MODEL_LEN - 5


def test_stop_token_ids_finish_with_stop(
    endless_engine: ContinuousEngine, endless_runner: ModelRunner, reference_model: PreTrainedModel
) -> None:
    prompt = [5, 6, 7]
    reference = hf_greedy(reference_model, endless_runner.eos_token_ids, prompt, 10)
    stop_token_id = reference[2]
    sampling = SamplingParams(max_tokens=10, temperature=0.0, stop_token_ids=(stop_token_id,))
    collector = run(endless_engine, "stop-id", prompt, sampling)
    assert collector.outputs[-1].finish_reason is FinishReason.STOP
    assert collector.token_ids == reference[: reference.index(stop_token_id) + 1]


def test_forward_error_fails_the_step_frees_its_blocks_and_the_loop_goes_on(
    engine: ContinuousEngine, runner: ModelRunner, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken_run(*args: object, **kwargs: object) -> torch.Tensor:
        raise RuntimeError("device on fire")

    monkeypatch.setattr(runner, "run", broken_run)
    failed = run(engine, "doomed", [5, 6, 7], greedy(4))
    assert failed.outputs == [EngineOutput("doomed", [], error="the engine step failed: device on fire")]
    assert engine.num_free_blocks == engine.num_blocks
    monkeypatch.undo()
    assert run(engine, "after", [5, 6, 7], greedy(4)).outputs[-1].error is None
    assert take_logged_errors(caplog) == ["an engine step over 1 requests failed"]


def test_raising_callback_does_not_stop_the_engine(engine: ContinuousEngine, caplog: pytest.LogCaptureFixture) -> None:
    def on_output(output: EngineOutput) -> None:
        raise ValueError("consumer bug")

    engine.submit(EngineRequest("bad-consumer", [5, 6, 7], greedy(3)), on_output)
    assert run(engine, "next", [5, 6, 7], greedy(3)).outputs[-1].error is None
    errors = take_logged_errors(caplog)
    assert errors and set(errors) == {"output callback of request bad-consumer raised"}


def test_stop_aborts_waiting_requests(runner: ModelRunner, tiny_config: Config) -> None:
    engine = ContinuousEngine(runner, tiny_config)
    collector = Collector()
    engine.submit(EngineRequest("never-run", [5, 6], greedy(3)), collector)
    engine.stop()
    assert collector.wait() == EngineOutput("never-run", [], FinishReason.ABORT)
    with pytest.raises(RuntimeError):
        engine.submit(EngineRequest("late", [5], greedy(1)), Collector())


def test_ignore_eos_runs_to_max_tokens_through_the_eos(
    engine: ContinuousEngine, runner: ModelRunner, tokenizer
) -> None:
    prompt = tokenizer.encode(PROMPTS[0])
    # the end of a reply made the model's first choice at every step, so it ends by itself whatever its weights
    ending = dataclasses.replace(greedy(64), logit_bias=tuple((token_id, 100.0) for token_id in runner.eos_token_ids))
    natural = run(engine, "natural", prompt, ending)
    assert natural.outputs[-1].finish_reason == FinishReason.STOP
    ignoring = run(engine, "ignoring", prompt, dataclasses.replace(ending, ignore_eos=True))
    assert ignoring.outputs[-1].finish_reason == FinishReason.LENGTH
    assert len(ignoring.token_ids) == 64
    assert ignoring.token_ids[: len(natural.token_ids)] == natural.token_ids


def test_a_request_that_finished_inside_a_failed_step_still_gets_its_output(
    engine: ContinuousEngine, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken_record(*args: object, **kwargs: object) -> None:
        raise RuntimeError("stats on fire")

    monkeypatch.setattr(engine, "_record_step", broken_record)
    failed = run(engine, "one-token", [5, 6, 7], greedy(1))  # the scheduler finishes it before the step raises
    assert failed.outputs == [EngineOutput("one-token", [], error="the engine step failed: stats on fire")]
    assert engine.num_free_blocks == engine.num_blocks
    monkeypatch.undo()
    assert take_logged_errors(caplog) == ["an engine step over 1 requests failed"]
