"""The engine in a process of its own serves what the engine in process does: the same greedy tokens, logprobs and
embeddings, cancels and a stop that abort what is in flight, a load and stats the worker can publish, a clear error
when the model cannot load, and no engine left running once its worker's end of the pipe closes."""

from __future__ import annotations

import dataclasses
import queue
import random
import time
import uuid
from collections.abc import Iterator

import pytest
import torch

from tasks.config import Config
from tasks.messages.generation import FinishReason, SamplingParams
from tasks.messages.grammar import GrammarKind, GrammarSpec
from tests.worker.engine_harness import TIMEOUT_S, Collector, greedy, submit_together
from worker.engine.continuous_engine import ContinuousEngine
from worker.engine.embedding.jobs import EmbeddingRequest, EmbeddingResult
from worker.engine.interface import EngineOutput, EngineRequest
from worker.engine.model_runner import ModelRunner
from worker.engine_process.client import EngineProcess, EngineProcessError

NUM_PROMPTS = 6


@pytest.fixture(scope="module")
def config(tiny_config: Config, redis_url: str) -> Config:
    return dataclasses.replace(tiny_config, redis_url=redis_url, redis_prefix=f"test-{uuid.uuid4().hex[:8]}:")


@pytest.fixture(scope="module")
def engine_process(config: Config) -> Iterator[EngineProcess]:
    engine = EngineProcess(config, "test-worker")
    yield engine
    engine.stop()


@pytest.fixture(scope="module")
def in_process(config: Config) -> Iterator[ContinuousEngine]:
    engine = ContinuousEngine(ModelRunner(config), config)
    engine.start()
    yield engine
    engine.stop(TIMEOUT_S)


def requests(seed: int) -> list[EngineRequest]:
    rng = random.Random(seed)
    sampling = SamplingParams(max_tokens=24, temperature=0.0, logprobs=2)
    return [
        EngineRequest(f"req-{seed}-{i}", [rng.randrange(5, 2000) for _ in range(rng.randint(3, 90))], sampling)
        for i in range(NUM_PROMPTS)
    ]


def test_it_serves_what_the_engine_in_process_does(engine_process: EngineProcess, in_process: ContinuousEngine) -> None:
    batch = requests(seed=3)
    theirs = [collector.outputs for collector in submit_together(in_process, batch)]
    ours = [collector.outputs for collector in submit_together(engine_process, batch)]
    assert [[o.new_token_ids for o in outputs] for outputs in ours] == [
        [o.new_token_ids for o in outputs] for outputs in theirs
    ]
    # the same tokens' logprobs, to float32 rounding: the two engines' steps may pack the rows differently
    assert logprob_values(ours) == pytest.approx(logprob_values(theirs), abs=1e-4)
    assert [outputs[-1].finish_reason for outputs in ours] == [outputs[-1].finish_reason for outputs in theirs]
    deadline = time.monotonic() + TIMEOUT_S  # load and stats come up with outputs now and then, and every second
    while engine_process.stats.num_steps == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert engine_process.stats.num_steps > 0
    assert engine_process.facts.num_blocks == in_process.num_blocks
    assert engine_process.load().num_blocks == in_process.num_blocks


def logprob_values(runs: list[list[EngineOutput]]) -> list[float]:
    return [
        value
        for outputs in runs
        for output in outputs
        for logprob in output.logprobs
        for value in (logprob.logprob, *(top for _, top in logprob.top))
    ]


def test_a_cancel_aborts_the_request(engine_process: EngineProcess) -> None:
    collector = Collector()
    endless = SamplingParams(max_tokens=4000, temperature=0.0, ignore_eos=True)
    engine_process.submit(EngineRequest("to-cancel", [5, 6, 7], endless), lambda output: collector(output))
    while not collector.outputs:
        collector.finished.wait(0.01)
    engine_process.cancel("to-cancel")
    assert collector.wait().finish_reason is FinishReason.ABORT


def test_a_cancel_after_the_last_output_sends_nothing(
    engine_process: EngineProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worker cancels each choice as it lets go of it, ended or not: only one still running costs a message."""
    collector = Collector()
    engine_process.submit(EngineRequest("ends", [5, 6, 7], greedy(3)), collector)
    collector.wait()
    sent: list[str] = []
    monkeypatch.setattr(engine_process, "_send", lambda kind, **fields: sent.append(kind))
    engine_process.cancel("ends")
    engine_process.cancel("never-submitted")
    assert sent == []


def test_embeddings_are_the_engine_in_process_ones(engine_process: EngineProcess, in_process: ContinuousEngine) -> None:
    request = EmbeddingRequest("embd-1", [[5, 6, 7, 8], [9, 10]], dimensions=16)
    results: list[EmbeddingResult] = []
    for engine in (in_process, engine_process):
        answers: queue.Queue[EmbeddingResult] = queue.Queue()
        engine.submit_embedding(request, answers.put)
        results.append(answers.get(timeout=TIMEOUT_S))
    theirs, ours = results
    assert ours.error is None and ours.vectors is not None and theirs.vectors is not None
    assert torch.equal(ours.vectors, theirs.vectors)


def test_a_model_that_cannot_load_fails_the_start_with_its_reason(config: Config, tmp_path) -> None:
    with pytest.raises(EngineProcessError, match="missing-model"):
        EngineProcess(dataclasses.replace(config, model=str(tmp_path / "missing-model")), "test-worker")


def test_stop_aborts_what_is_in_flight_and_ends_the_process(config: Config) -> None:
    engine = EngineProcess(config, "test-worker")
    collector = Collector()
    endless = SamplingParams(max_tokens=4000, temperature=0.0, ignore_eos=True)
    engine.submit(EngineRequest("in-flight", [5, 6, 7], endless), collector)
    engine.stop()
    assert collector.wait().finish_reason is FinishReason.ABORT
    assert not engine.is_alive()


def test_the_engine_ends_when_its_workers_pipe_closes(config: Config) -> None:
    """What a worker killed with SIGKILL leaves: its ends of the pipes closed by the kernel."""
    engine = EngineProcess(config, "test-worker")
    engine._requests.close()
    engine._process.join(TIMEOUT_S)
    assert engine._process.exitcode == 0
    assert not engine.is_alive()


def test_a_grammar_request_cancelled_as_it_is_submitted_ends_aborted_and_holds_up_no_other(
    engine_process: EngineProcess,
) -> None:
    """A request with a grammar is submitted from the engine process's pool (its grammar compiles there); a cancel
    that comes before that submit returns still reaches it, and a plain request sent after it is not held up."""
    schema = '{"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}'
    grammar = GrammarSpec(GrammarKind.JSON_SCHEMA, schema, "response_format")
    constrained, plain = Collector(), Collector()
    endless = SamplingParams(max_tokens=4000, temperature=0.0, ignore_eos=True)
    engine_process.submit(EngineRequest("with-grammar", [5, 6, 7], endless, grammar=grammar), constrained)
    engine_process.cancel("with-grammar")
    engine_process.submit(EngineRequest("plain", [8, 9, 10], greedy(4)), plain)
    assert constrained.wait().finish_reason is FinishReason.ABORT
    assert plain.wait().finish_reason in (FinishReason.LENGTH, FinishReason.STOP)
