"""What the engine tests share: collecting a request's outputs, running requests, and HF's greedy reference."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator

import pytest
import torch
from transformers import PreTrainedModel

from tasks.config import Config
from tasks.messages.generation import SamplingParams
from tasks.messages.steering import MonitorSpec, SteeringSpec
from worker.engine.continuous_engine import ContinuousEngine
from worker.engine.interface import EngineOutput, EngineRequest
from worker.engine.model_runner import ModelRunner

TIMEOUT_S = 240  # a bound for a hang, not a speed target: under Triton's interpreter a busy machine takes minutes
SHORT_MAX_MODEL_LEN = 12


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


def load_runner(config: Config, stops_at_eos: bool = True) -> ModelRunner:
    runner = ModelRunner(config)
    if not stops_at_eos:
        runner.eos_token_ids = frozenset()
    return runner


def serve(runner: ModelRunner, config: Config, caplog: pytest.LogCaptureFixture) -> Iterator[ContinuousEngine]:
    """A running engine; the test fails if the engine logged an error that the test did not take out of caplog,
    or if any KV block is still held once every request has finished."""
    engine = ContinuousEngine(runner, config)
    engine.start()
    yield engine
    engine.stop(timeout_s=TIMEOUT_S)
    assert take_logged_errors(caplog) == []
    assert engine.num_free_blocks == engine.num_blocks


def take_logged_errors(caplog: pytest.LogCaptureFixture) -> list[str]:
    messages = [record.getMessage() for record in caplog.records if record.levelno >= logging.ERROR]
    caplog.clear()
    return messages


def greedy(max_tokens: int) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0.0)


def run(
    engine: ContinuousEngine,
    request_id: str,
    prompt: list[int],
    sampling: SamplingParams,
    steering: SteeringSpec | None = None,
    monitor: MonitorSpec | None = None,
) -> Collector:
    collector = Collector()
    engine.submit(EngineRequest(request_id, prompt, sampling, steering=steering, monitor=monitor), collector)
    collector.wait()
    return collector


def hf_greedy(
    reference: PreTrainedModel, eos_token_ids: frozenset[int], prompt: list[int], max_new_tokens: int
) -> list[int]:
    """HF `generate` for one unpadded prompt, stopping at `eos_token_ids` (an empty set disables EOS)."""
    input_ids = torch.tensor([prompt], device=reference.device)
    output = reference.generate(
        input_ids,
        attention_mask=torch.ones_like(input_ids),  # else generate masks out any pad-token id in the prompt
        do_sample=False,
        max_new_tokens=max_new_tokens,
        eos_token_id=sorted(eos_token_ids),
    )
    return output[0, len(prompt) :].tolist()


def submit_at_once(engine: ContinuousEngine, requests: list[EngineRequest]) -> list[Collector]:
    """Submits every request before the engine thread can take any, so that one step admits them all whatever the
    machine's speed: threads released together reached an idle engine a step or more apart, and on a fast machine a
    short request had ended before the last one came. The engine thread takes new work under its inbox's lock, which
    is reentrant (`submit` takes it too)."""
    collectors = [Collector() for _ in requests]
    with engine._inbox._cond:
        for request, collector in zip(requests, collectors, strict=True):
            engine.submit(request, collector)
    for collector in collectors:
        collector.wait()
    return collectors


def submit_together(engine: ContinuousEngine, requests: list[EngineRequest]) -> list[Collector]:
    """Submits each request from its own thread, all released at once."""
    collectors = [Collector() for _ in requests]
    barrier = threading.Barrier(len(requests))

    def submit(index: int) -> None:
        barrier.wait()
        engine.submit(requests[index], collectors[index])

    threads = [threading.Thread(target=submit, args=(index,)) for index in range(len(requests))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(TIMEOUT_S)
    for collector in collectors:
        collector.wait()
    return collectors
