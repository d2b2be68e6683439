from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from tasks.config import Config
from tasks.messages import FinishReason, SamplingParams
from worker.batch_engine import BatchEngine
from worker.engine import EngineOutput, EngineRequest
from worker.model_runner import ModelRunner

TIMEOUT_S = 60
PROMPTS = [
    "The quick brown fox",
    "Once",
    "héllo 日本 🙂 one two three four five",
    "a small model that liked to count",
    "lazy dog. The",
    "Once upon a time there was a small model",
]


class Collector:
    """The outputs of one request, as its callback receives them."""

    def __init__(self) -> None:
        self.outputs: list[EngineOutput] = []
        self.finished = threading.Event()

    def __call__(self, output: EngineOutput) -> None:
        self.outputs.append(output)
        if output.is_finished:
            self.finished.set()

    def wait(self) -> EngineOutput:
        assert self.finished.wait(TIMEOUT_S), "the request did not finish"
        return self.outputs[-1]

    @property
    def token_ids(self) -> list[int]:
        return [token_id for output in self.outputs for token_id in output.new_token_ids]


@pytest.fixture(scope="module")
def runner(tiny_config: Config) -> ModelRunner:
    return ModelRunner(tiny_config)


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path) -> PreTrainedTokenizerBase:
    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture
def engine(runner: ModelRunner, caplog: pytest.LogCaptureFixture) -> Iterator[BatchEngine]:
    """A running engine; the test fails if the engine logged an error it did not take out of caplog."""
    engine = BatchEngine(runner, max_batch_size=8)
    engine.start()
    yield engine
    engine.stop(timeout_s=TIMEOUT_S)
    assert [record.getMessage() for record in caplog.records if record.levelno >= logging.ERROR] == []


def take_logged_errors(caplog: pytest.LogCaptureFixture) -> list[str]:
    messages = [record.getMessage() for record in caplog.records if record.levelno >= logging.ERROR]
    caplog.clear()
    return messages


def greedy(max_tokens: int) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0.0)


def run(engine: BatchEngine, request_id: str, prompt: list[int], sampling: SamplingParams) -> Collector:
    collector = Collector()
    engine.submit(EngineRequest(request_id, prompt, sampling), collector)
    collector.wait()
    return collector


def hf_greedy(runner: ModelRunner, prompt: list[int], max_new_tokens: int) -> list[int]:
    input_ids = torch.tensor([prompt], device=runner.device)
    output = runner.model.generate(input_ids, do_sample=False, max_new_tokens=max_new_tokens)
    return output[0, len(prompt) :].tolist()


def test_single_greedy_request_matches_hf_generate(
    engine: BatchEngine, runner: ModelRunner, tokenizer: PreTrainedTokenizerBase
) -> None:
    prompt = tokenizer.encode(PROMPTS[0])
    collector = run(engine, "solo", prompt, greedy(20))
    assert collector.token_ids == hf_greedy(runner, prompt, 20)
    assert all(len(output.new_token_ids) == 1 for output in collector.outputs)
    assert [output.is_finished for output in collector.outputs].count(True) == 1


def test_concurrent_requests_share_batches_and_match_solo_greedy(
    engine: BatchEngine, runner: ModelRunner, tokenizer: PreTrainedTokenizerBase
) -> None:
    max_tokens = 16
    prompts = [tokenizer.encode(text) for text in PROMPTS]
    assert len({len(prompt) for prompt in prompts}) > 1
    collectors = [Collector() for _ in prompts]
    barrier = threading.Barrier(len(prompts))

    def submit(index: int) -> None:
        barrier.wait()
        engine.submit(EngineRequest(f"req-{index}", prompts[index], greedy(max_tokens)), collectors[index])

    threads = [threading.Thread(target=submit, args=(index,)) for index in range(len(prompts))]
    for thread in threads:
        thread.start()
    finals = [collector.wait() for collector in collectors]

    for prompt, collector, final in zip(prompts, collectors, finals):
        assert final.error is None
        assert collector.token_ids == hf_greedy(runner, prompt, max_tokens)
        if final.finish_reason is FinishReason.LENGTH:
            assert len(collector.token_ids) == max_tokens
        else:
            assert final.finish_reason is FinishReason.STOP
            assert collector.token_ids[-1] in runner.eos_token_ids
    assert engine.stats.max_batch_size_seen > 1
    assert engine.stats.num_prefill_batches < len(prompts)


def test_cancel_aborts_at_the_next_step(engine: BatchEngine, tokenizer: PreTrainedTokenizerBase) -> None:
    reached_two_tokens, cancelled = threading.Event(), threading.Event()
    collector = Collector()

    def on_output(output: EngineOutput) -> None:
        collector(output)
        if len(collector.outputs) == 2:
            reached_two_tokens.set()
            cancelled.wait(TIMEOUT_S)

    prompt = tokenizer.encode(PROMPTS[1])
    engine.submit(EngineRequest("to-cancel", prompt, greedy(40)), on_output)
    assert reached_two_tokens.wait(TIMEOUT_S)
    engine.cancel("to-cancel")
    cancelled.set()
    final = collector.wait()
    assert final == EngineOutput("to-cancel", [], FinishReason.ABORT)
    assert len(collector.outputs) == 3


def test_cancel_before_the_first_step_aborts_with_no_tokens(runner: ModelRunner) -> None:
    engine = BatchEngine(runner, max_batch_size=8)
    collector = Collector()
    engine.submit(EngineRequest("early", [5, 6, 7], greedy(5)), collector)
    engine.cancel("early")
    engine.start()
    try:
        assert collector.wait() == EngineOutput("early", [], FinishReason.ABORT)
    finally:
        engine.stop(timeout_s=TIMEOUT_S)


def test_seeded_sampling_is_reproducible_alone_and_in_a_batch(
    engine: BatchEngine, tokenizer: PreTrainedTokenizerBase
) -> None:
    prompt = tokenizer.encode(PROMPTS[2])
    seeded = SamplingParams(max_tokens=12, temperature=1.0, top_p=0.95, seed=1234)
    first = run(engine, "seeded-1", prompt, seeded).token_ids
    assert run(engine, "seeded-2", prompt, seeded).token_ids == first
    other_seed = run(engine, "seeded-3", prompt, dataclasses.replace(seeded, seed=99)).token_ids
    assert other_seed != first

    crowd = {f"crowd-{index}": Collector() for index in range(3)}
    unseeded = dataclasses.replace(seeded, seed=None)
    for (request_id, collector), text in zip(crowd.items(), PROMPTS[3:]):
        engine.submit(EngineRequest(request_id, tokenizer.encode(text), unseeded), collector)
    in_batch = Collector()
    engine.submit(EngineRequest("seeded-in-batch", prompt, seeded), in_batch)
    in_batch.wait()
    for collector in crowd.values():
        collector.wait()
    assert in_batch.token_ids == first


def test_prompt_over_max_model_len_gets_an_error(engine: BatchEngine, runner: ModelRunner) -> None:
    too_long = run(engine, "too-long", [5] * runner.max_model_len, greedy(4))
    assert too_long.token_ids == []
    assert too_long.outputs[-1].error is not None and "prompt" in too_long.outputs[-1].error
    just_fits = run(engine, "just-fits", [5] * (runner.max_model_len - 1), greedy(4))
    assert len(just_fits.token_ids) == 1
    assert just_fits.outputs[-1].finish_reason in (FinishReason.LENGTH, FinishReason.STOP)


def test_generation_stops_at_max_model_len(runner: ModelRunner, tiny_config: Config) -> None:
    short = dataclasses.replace(tiny_config, max_model_len=12)
    engine = BatchEngine(ModelRunner(short), max_batch_size=4)
    engine.start()
    try:
        collector = run(engine, "short-context", [5, 6, 7, 8, 9], greedy(100))
    finally:
        engine.stop(timeout_s=TIMEOUT_S)
    if collector.outputs[-1].finish_reason is FinishReason.LENGTH:
        assert len(collector.token_ids) == 12 - 5
    else:
        assert collector.token_ids[-1] in runner.eos_token_ids


def test_stop_token_ids_finish_with_stop(engine: BatchEngine, runner: ModelRunner) -> None:
    prompt = [5, 6, 7]
    third_token = hf_greedy(runner, prompt, 3)[2]
    sampling = SamplingParams(max_tokens=10, temperature=0.0, stop_token_ids=(third_token,))
    collector = run(engine, "stop-id", prompt, sampling)
    assert collector.outputs[-1].finish_reason is FinishReason.STOP
    assert collector.token_ids[-1] == third_token
    assert len(collector.token_ids) <= 3


def test_forward_error_fails_the_cohort_and_the_loop_goes_on(
    engine: BatchEngine, runner: ModelRunner, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken_forward(*args: object, **kwargs: object) -> torch.Tensor:
        raise RuntimeError("device on fire")

    monkeypatch.setattr(runner, "forward", broken_forward)
    failed = run(engine, "doomed", [5, 6, 7], greedy(4))
    assert failed.outputs == [EngineOutput("doomed", [], error="device on fire")]
    monkeypatch.undo()
    assert run(engine, "after", [5, 6, 7], greedy(4)).outputs[-1].error is None
    assert take_logged_errors(caplog) == ["cohort of 1 requests failed"]


def test_raising_callback_does_not_stop_the_engine(engine: BatchEngine, caplog: pytest.LogCaptureFixture) -> None:
    def on_output(output: EngineOutput) -> None:
        raise ValueError("consumer bug")

    engine.submit(EngineRequest("bad-consumer", [5, 6, 7], greedy(3)), on_output)
    assert run(engine, "next", [5, 6, 7], greedy(3)).outputs[-1].error is None
    errors = take_logged_errors(caplog)
    assert errors and set(errors) == {"output callback of request bad-consumer raised"}


def test_stop_aborts_waiting_requests(runner: ModelRunner) -> None:
    engine = BatchEngine(runner, max_batch_size=8)
    collector = Collector()
    engine.submit(EngineRequest("never-run", [5, 6], greedy(3)), collector)
    engine.stop()
    assert collector.wait() == EngineOutput("never-run", [], FinishReason.ABORT)
    with pytest.raises(RuntimeError):
        engine.submit(EngineRequest("late", [5], greedy(1)), Collector())
