"""Monitoring inside the continuous batch: each request's top-k SAE features at the positions it asked for, equal to
encoding HF's own residual stream, read after steering; and the worker-wide running statistics."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from transformers import PreTrainedModel

from scheduler.batch import ScheduledChunk
from scheduler.request import Request
from steering.registry import SAELookupError, SAERegistry
from steering.sae import SAE
from steering.sae_math import encode
from tasks.config import Config
from tasks.messages.generation import SamplingParams
from tasks.messages.steering import MonitorPositions, MonitorSpec, SteeringFeature, SteeringSpec
from tests.steering.sae_folders import TINY_SAE_ID
from tests.worker.engine_harness import Collector, greedy, hf_greedy, run, serve, submit_together
from worker.engine.continuous_engine import ContinuousEngine
from worker.engine.interface import EngineRequest
from worker.engine.model_runner import ModelRunner
from worker.steering.request_sae import RequestMonitor
from worker.steering.worker_monitor import start_worker_monitor

pytestmark = pytest.mark.usefixtures("tiny_sae_root")
LAYER = 2
PROMPT = list(range(40, 61))  # 21 tokens: three prefill chunks of 8
MAX_TOKENS = 6
TOP_K = 3


@pytest.fixture(scope="module")
def sae(tiny_sae_root: Path) -> SAE:
    return SAERegistry(tiny_sae_root).get(TINY_SAE_ID)


@pytest.fixture
def chunked_engine(
    endless_runner: ModelRunner, tiny_config: Config, caplog: pytest.LogCaptureFixture
) -> Iterator[ContinuousEngine]:
    config = dataclasses.replace(tiny_config, prefill_chunk_size=8, max_num_batched_tokens=16)
    yield from serve(endless_runner, config, caplog)


def reference_acts(reference: PreTrainedModel, sae: SAE, token_ids: list[int]) -> torch.Tensor:
    """The SAE's activations [T, d_sae] of HF's residual after decoder layer LAYER over `token_ids`."""
    captured = []
    handle = reference.model.layers[LAYER].register_forward_hook(lambda m, a, output: captured.append(output))
    try:
        with torch.inference_mode():
            reference(input_ids=torch.tensor([token_ids]))
    finally:
        handle.remove()
    return encode(sae, captured[0][0])


def monitored(collector: Collector) -> list:
    return [position for output in collector.outputs for position in output.monitor]


def test_every_position_is_read_once_and_matches_hf_across_chunked_prefill(
    chunked_engine: ContinuousEngine, reference_model: PreTrainedModel, sae: SAE
) -> None:
    spec = MonitorSpec(TINY_SAE_ID, top_k=TOP_K)
    requests = [
        EngineRequest("plain", list(range(100, 130)), greedy(MAX_TOKENS)),
        EngineRequest("watched", PROMPT, greedy(MAX_TOKENS), monitor=spec),
    ]
    plain, watched = submit_together(chunked_engine, requests)
    sequence = PROMPT + watched.token_ids[:-1]  # the last generated token is never read
    positions = monitored(watched)

    assert [p.position for p in positions] == list(range(len(sequence)))
    assert [p.token_id for p in positions] == sequence
    expected_values, expected_indices = reference_acts(reference_model, sae, sequence).topk(TOP_K, dim=-1)
    values = torch.tensor([[value for _, value in p.features] for p in positions])
    indices = torch.tensor([[index for index, _ in p.features] for p in positions])
    torch.testing.assert_close(values, expected_values, atol=1e-4, rtol=1e-4)
    is_active = expected_values > 1e-3  # zeros tie, in any order
    assert torch.equal(indices[is_active], expected_indices[is_active])
    assert monitored(plain) == []


@pytest.mark.parametrize(
    ("positions", "expected"),
    [
        (MonitorPositions.PROMPT, range(len(PROMPT))),
        (MonitorPositions.COMPLETION, range(len(PROMPT), len(PROMPT) + MAX_TOKENS - 1)),
        (MonitorPositions.LAST, [len(PROMPT) + MAX_TOKENS - 2]),
    ],
)
def test_positions_select_prompt_completion_or_last(
    endless_engine: ContinuousEngine, positions: MonitorPositions, expected: range
) -> None:
    spec = MonitorSpec(TINY_SAE_ID, top_k=2, features=(5, 6, 7), positions=positions)
    watched = run(endless_engine, "watched", PROMPT, greedy(MAX_TOKENS), monitor=spec)
    read = monitored(watched)
    if positions is MonitorPositions.LAST:
        read = read[-1:]  # one per step; the report keeps the last (what the worker's report does)
    assert [p.position for p in read] == list(expected)
    assert all({index for index, _ in p.features} <= {5, 6, 7} and len(p.features) == 2 for p in read)


def test_the_monitor_reads_the_residual_after_steering(endless_engine: ContinuousEngine, steering_demo: dict) -> None:
    feature = steering_demo["features"][0]
    spec = MonitorSpec(TINY_SAE_ID, top_k=1, features=(feature["index"],))
    steering = SteeringSpec(TINY_SAE_ID, (SteeringFeature(feature["index"], feature["strength"]),))
    plain = run(endless_engine, "plain", PROMPT, greedy(MAX_TOKENS), monitor=spec)
    steered = run(endless_engine, "steered", PROMPT, greedy(MAX_TOKENS), steering=steering, monitor=spec)
    assert all(p.features[0][1] == 0.0 for p in monitored(plain))
    assert min(p.features[0][1] for p in monitored(steered)) > 1.0


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (MonitorSpec(TINY_SAE_ID, top_k=0), "top_k must lie in [1, 64]"),
        (MonitorSpec(TINY_SAE_ID, top_k=65), "top_k must lie in [1, 64]"),
        (MonitorSpec(TINY_SAE_ID, features=(512,)), "[0, 512)"),
        (MonitorSpec(TINY_SAE_ID, features=(1, 1)), "distinct"),
        (MonitorSpec("tiny/none"), "unknown sae_id"),
        (MonitorSpec(TINY_SAE_ID, top_k=64, positions=MonitorPositions.ALL), "at most 32768 fit"),
    ],
)
def test_bad_monitors_fail_their_request(endless_engine: ContinuousEngine, spec: MonitorSpec, message: str) -> None:
    failed = run(endless_engine, "bad", [5, 6, 7], SamplingParams(max_tokens=600, temperature=0.0), monitor=spec)
    assert failed.token_ids == [] and message in failed.outputs[-1].error


def test_the_worker_monitor_counts_every_token_the_engine_computes(
    endless_engine: ContinuousEngine, endless_runner: ModelRunner, reference_model: PreTrainedModel, sae: SAE
) -> None:
    max_tokens = 16

    def self_grounded(opening: list[int]) -> list[int]:
        """The opening, the model's own continuation, the opening again: prompt lookup proposes at once."""
        return [*opening, *hf_greedy(reference_model, frozenset(), opening, max_tokens), *opening]

    run(endless_engine, "unmonitored", self_grounded(list(range(70, 90))), greedy(max_tokens))
    num_proposed = endless_engine.stats.num_proposed_tokens
    assert num_proposed > 0
    prompt = self_grounded(PROMPT)
    monitor = start_worker_monitor(endless_runner.saes, TINY_SAE_ID, [3, 4])
    endless_engine.set_worker_monitor(monitor)
    try:
        tokens = run(endless_engine, "counted", prompt, greedy(max_tokens)).token_ids
    finally:
        endless_engine.set_worker_monitor(None)
    assert endless_engine.stats.num_proposed_tokens == num_proposed  # every row is monitored: none speculates
    run(endless_engine, "uncounted", prompt, greedy(2))
    snapshot = monitor.stats.snapshot()
    acts = reference_acts(reference_model, sae, prompt + tokens[:-1])[:, [3, 4]]  # [T, 2]
    assert snapshot["count"] == len(prompt) + max_tokens - 1
    assert [f["max"] for f in snapshot["features"]] == pytest.approx(acts.max(0).values.tolist(), abs=1e-4)
    with pytest.raises(SAELookupError):
        start_worker_monitor(endless_runner.saes, "tiny/none", [0])
    with pytest.raises(ValueError, match="lie in"):
        start_worker_monitor(endless_runner.saes, TINY_SAE_ID, [512])


def test_a_recomputed_request_reports_each_position_once(sae: SAE) -> None:
    request = Request("r", list(range(10)), max_tokens=4)
    monitor = RequestMonitor(MonitorSpec(TINY_SAE_ID), sae, None, None, num_prompt_tokens=10)  # type: ignore[arg-type]
    assert monitor.take_positions(ScheduledChunk.of(request, 6)) == list(range(6))
    request.num_computed_tokens = 6
    assert monitor.take_positions(ScheduledChunk.of(request, 4)) == list(range(6, 10))
    request.num_computed_tokens, request.output_token_ids = 0, [99]  # preempted after one token: recompute all
    assert monitor.take_positions(ScheduledChunk.of(request, 11)) == [10]


def test_a_monitor_of_the_prompt_computes_a_prompt_the_prefix_cache_holds(endless_engine: ContinuousEngine) -> None:
    prompt = list(range(200, 264))  # four full KV blocks, cached by the first run
    run(endless_engine, "caches", prompt, greedy(2))
    hits = endless_engine.stats.prefix_cache_hit_blocks
    spec = MonitorSpec(TINY_SAE_ID, top_k=1, positions=MonitorPositions.PROMPT)
    watched = run(endless_engine, "watched", prompt, greedy(2), monitor=spec)
    assert [p.position for p in monitored(watched)] == list(range(len(prompt)))
    assert endless_engine.stats.prefix_cache_hit_blocks == hits
    run(endless_engine, "reuses", prompt, greedy(2), monitor=dataclasses.replace(spec, positions=MonitorPositions.LAST))
    assert endless_engine.stats.prefix_cache_hit_blocks > hits  # a monitor of the last position does not need it
