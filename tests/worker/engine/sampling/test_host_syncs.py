"""Each engine step waits for the device once, to read its tokens and logprobs back (and once more for its monitors'
results when a monitor read this step), with every sampler feature, steering and monitoring in the batch. On CUDA
(`gpu` marker) the steps run under `torch.cuda.set_sync_debug_mode("error")`, so any other wait raises and fails the
requests; on CPU only the read-backs are counted."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import torch

from tasks.config import Config
from tasks.messages.generation import SamplingParams
from tasks.messages.steering import MonitorSpec, SteeringFeature, SteeringSpec
from tests.steering.sae_folders import TINY_SAE_ID
from tests.worker.engine_harness import Collector, greedy, load_runner
from worker.engine.continuous_engine import ContinuousEngine
from worker.engine.interface import EngineRequest
from worker.engine.sampling import step_readback
from worker.engine.transfers import to_host
from worker.steering import steering_plan

pytestmark = pytest.mark.usefixtures("tiny_sae_root")
DEVICES = [
    "cpu",
    pytest.param(
        "cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]
    ),
]
MAX_TOKENS = 6


@pytest.fixture
def read_backs(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Who called `to_host`, once per call; on CUDA each call may wait, everything else may not."""
    callers: list[str] = []

    def counted(caller: str) -> object:
        def read(*tensors: torch.Tensor) -> list[torch.Tensor]:
            callers.append(caller)
            if not torch.cuda.is_available():
                return to_host(*tensors)
            mode = torch.cuda.get_sync_debug_mode()  # "error" inside a checked step, "default" outside one
            torch.cuda.set_sync_debug_mode("default")
            try:
                return to_host(*tensors)
            finally:
                torch.cuda.set_sync_debug_mode(mode)

        return read

    monkeypatch.setattr(step_readback, "to_host", counted("tokens"))
    monkeypatch.setattr(steering_plan, "to_host", counted("monitors"))
    return callers


@contextmanager
def device_waits_raise(device: str) -> Iterator[None]:
    """Any device wait but the read-backs raises inside the step (CUDA only)."""
    if device == "cuda":
        torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        if device == "cuda":
            torch.cuda.set_sync_debug_mode("default")


def admit(engine: ContinuousEngine, requests: list[EngineRequest]) -> list[Collector]:
    """Submits and admits the requests (seeded generators are made here, outside the steps)."""
    collectors = [Collector() for _ in requests]
    for request, collector in zip(requests, collectors, strict=True):
        engine.submit(request, collector)
    engine.take_new_work()
    return collectors


def step_to_end(engine: ContinuousEngine, read_backs: list[str]) -> list[list[str]]:
    """Steps the engine on this thread until it is idle; each step's read-backs."""
    per_step: list[list[str]] = []
    while engine._scheduler.has_work:
        before = len(read_backs)
        engine.step()
        per_step.append(read_backs[before:])
    return per_step


def every_feature(steering_demo: dict, name: str) -> list[EngineRequest]:
    feature = steering_demo["features"][0]
    steering = SteeringSpec(TINY_SAE_ID, (SteeringFeature(feature["index"], feature["strength"]),))
    sampled = SamplingParams(
        max_tokens=MAX_TOKENS, temperature=0.8, top_k=50, top_p=0.9, min_p=0.01, seed=3, logprobs=3,
        repetition_penalty=1.2, presence_penalty=0.5, frequency_penalty=0.5, min_tokens=MAX_TOKENS,
        stop_token_ids=(7,),
    )  # fmt: skip
    return [
        EngineRequest(f"{name}-greedy", list(range(5, 25)), greedy(MAX_TOKENS)),
        EngineRequest(f"{name}-sampled", list(range(30, 41)), sampled),
        EngineRequest(f"{name}-steered", list(range(50, 53)), greedy(MAX_TOKENS), steering=steering),
        EngineRequest(
            f"{name}-monitored", list(range(60, 69)), greedy(MAX_TOKENS), monitor=MonitorSpec(TINY_SAE_ID, top_k=2)
        ),
    ]


@pytest.mark.parametrize("device", DEVICES)
def test_each_step_reads_back_once_and_its_monitors_once(
    device: str, tiny_config: Config, steering_demo: dict, read_backs: list[str]
) -> None:
    backend = "triton" if device == "cuda" else "auto"
    config = dataclasses.replace(
        tiny_config, device=device, attention_backend=backend, speculative_method="none", max_num_seqs=8
    )
    engine = ContinuousEngine(load_runner(config, stops_at_eos=False), config)  # stepped on this thread
    admit(engine, every_feature(steering_demo, "warm-up"))
    step_to_end(engine, read_backs)  # the graphs are captured again with the hook points (a wait, once)
    requests = every_feature(steering_demo, "checked")
    collectors = admit(engine, requests)
    with device_waits_raise(device):
        per_step = step_to_end(engine, read_backs)

    assert [c.outputs[-1].error for c in collectors] == [None] * len(requests)
    assert all(len(c.token_ids) == MAX_TOKENS for c in collectors)
    assert [sorted(step) for step in per_step] == [["monitors", "tokens"]] * len(per_step)  # monitored every step
    assert all(len(output.logprobs) == 1 for output in collectors[1].outputs if output.new_token_ids)
