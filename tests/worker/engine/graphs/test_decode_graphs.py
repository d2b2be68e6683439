"""Decode steps through DecodeGraphs against the same runner's eager steps: the logits of every step, and in the engine
the greedy tokens, steering and monitors. On CPU the padded static-buffer steps run eagerly (CUDA_GRAPHS=eager_replay,
the Triton kernels under the interpreter); on CUDA (`gpu` marker) they are captured graphs, in float32 and bfloat16.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import pytest
import torch
from transformers import AutoModelForCausalLM, PreTrainedTokenizerBase

from scheduler.request import Request
from scheduler.scheduler import Scheduler
from tasks.config import Config
from tasks.messages.steering import MonitorSpec, SteeringFeature, SteeringSpec
from tests.steering.sae_folders import TINY_SAE_ID
from tests.worker.engine_harness import greedy, hf_greedy, load_runner, serve, submit_together
from tests.worker.greedy_cases import chat_prompts, clear_cases
from worker.engine.continuous_engine import ContinuousEngine, scheduler_config
from worker.engine.graphs.cuda_graphs import DecodeGraphs
from worker.engine.graphs.graph_mode import GraphMode
from worker.engine.interface import EngineRequest
from worker.engine.model_runner import ModelRunner
from worker.steering.request_sae import RequestSAE, resolve_request_sae

pytestmark = pytest.mark.usefixtures("tiny_sae_root")
ON_CUDA = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]
SETUPS = [  # (device, dtype, CUDA_GRAPHS)
    pytest.param(("cpu", "float32", "eager_replay"), id="cpu-eager-replay"),
    pytest.param(("cuda", "float32", "auto"), id="cuda-float32", marks=ON_CUDA),
    pytest.param(("cuda", "bfloat16", "auto"), id="cuda-bfloat16", marks=ON_CUDA),
]
PROMPTS = [list(range(5, 5 + n)) for n in (3, 24, 11)]  # three rows: bucket 4 with a padding row
MAX_TOKENS = 8
TOLERANCES = {"float32": {"atol": 2e-4, "rtol": 2e-4}, "bfloat16": {"atol": 0.1, "rtol": 0.05}}


@pytest.fixture(scope="module", params=SETUPS)
def setup(request: pytest.FixtureRequest, tiny_config: Config) -> tuple[Config, Config]:
    """The graph config and the same without graphs, both through the Triton kernels."""
    device, dtype, graphs = request.param
    config = dataclasses.replace(
        tiny_config,
        device=device,
        dtype=dtype,
        attention_backend="triton",
        prefill_chunk_size=16,
        max_num_seqs=8,
        speculative_method="none",  # verify chunks would run eagerly
    )
    return dataclasses.replace(config, cuda_graphs=graphs), dataclasses.replace(config, cuda_graphs="off")


@pytest.fixture(scope="module")
def runners(setup: tuple[Config, Config]) -> tuple[ModelRunner, ModelRunner]:
    graph_runner, eager_runner = (load_runner(config, stops_at_eos=False) for config in setup)
    expected = GraphMode.CAPTURE if setup[0].device == "cuda" else GraphMode.EAGER_REPLAY
    assert graph_runner.graph_mode is expected
    assert eager_runner.graph_mode is None
    return graph_runner, eager_runner


@pytest.fixture
def engines(
    runners: tuple[ModelRunner, ModelRunner], setup: tuple[Config, Config], caplog: pytest.LogCaptureFixture
) -> Iterator[tuple[ContinuousEngine, ContinuousEngine]]:
    serving = [serve(runner, config, caplog) for runner, config in zip(runners, setup, strict=True)]
    yield next(serving[0]), next(serving[1])
    for server in serving:
        next(server, None)


@pytest.fixture
def graph_steps(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The number of rows of every step that ran through DecodeGraphs."""
    rows: list[int] = []
    run = DecodeGraphs.run

    def counted(self: DecodeGraphs, chunks: list, plan: object) -> object:
        rows.append(len(chunks))
        return run(self, chunks, plan)

    monkeypatch.setattr(DecodeGraphs, "run", counted)
    return rows


def test_every_decode_step_through_its_bucket_gives_the_eager_steps_logits(
    runners: tuple[ModelRunner, ModelRunner], setup: tuple[Config, Config], graph_steps: list[int]
) -> None:
    """Both runners step the same requests, each with its own scheduler; the eager runner's tokens drive both."""
    schedulers = [Scheduler(scheduler_config(config, runner)) for runner, config in zip(runners, setup, strict=True)]
    for scheduler in schedulers:
        for i, prompt in enumerate(PROMPTS):
            scheduler.add(Request(f"r{i}", prompt, max_tokens=4 + 3 * i))  # rows finish apart: buckets 4, 2, 1
    while schedulers[1].has_work:
        batches = [scheduler.schedule() for scheduler in schedulers]
        graph_logits, eager_logits = (runner.run(batch).logits for runner, batch in zip(runners, batches, strict=True))
        torch.testing.assert_close(graph_logits, eager_logits, **TOLERANCES[setup[0].dtype])
        tokens = [[token] for token in eager_logits.argmax(-1).tolist()]
        for scheduler, batch in zip(schedulers, batches, strict=True):
            scheduler.update_from_output(batch, tokens)
    assert not schedulers[0].has_work
    assert {1, 2, 3} <= set(graph_steps)  # three rows padded to 4, then fewer


def test_greedy_decoding_in_graphs_equals_eager_and_hf_generate(
    engines: tuple[ContinuousEngine, ContinuousEngine],
    setup: tuple[Config, Config],
    tokenizer: PreTrainedTokenizerBase,
    graph_steps: list[int],
) -> None:
    """On cases that no rounding can flip (tests/worker/greedy_cases.py): graph and eager engines and float32 HF
    agree token for token, in either dtype."""
    config = setup[0]
    float32_model = AutoModelForCausalLM.from_pretrained(config.model, dtype=torch.float32).to(config.device).eval()
    cases = clear_cases(float32_model, chat_prompts(tokenizer))[:4]
    expected = [hf_greedy(float32_model, frozenset(), prompt, length) for prompt, length in cases]
    requests = [EngineRequest(f"req-{i}", prompt, greedy(length)) for i, (prompt, length) in enumerate(cases)]
    for engine in engines:
        assert [collector.token_ids for collector in submit_together(engine, requests)] == expected
    assert max(graph_steps) == len(cases)  # every case decoding at once, in a graph


def steered_rows(runner: ModelRunner, config: Config, steering_demo: dict) -> dict[str, RequestSAE | None]:
    """Per request: none, one steered feature, another with a monitor too (resolved for this runner: monitors keep
    their own read positions)."""
    features = steering_demo["features"]
    steer = [SteeringSpec(TINY_SAE_ID, (SteeringFeature(f["index"], f["strength"]),)) for f in features[:2]]
    requests = [
        EngineRequest("r1", PROMPTS[1], greedy(MAX_TOKENS), steering=steer[0]),
        EngineRequest(
            "r2", PROMPTS[2], greedy(MAX_TOKENS), steering=steer[1], monitor=MonitorSpec(TINY_SAE_ID, top_k=3)
        ),
    ]
    return {"r0": None, **{r.request_id: resolve_request_sae(r, runner.saes, config) for r in requests}}


def test_steering_and_monitors_inside_graphs_equal_eager_steering(
    runners: tuple[ModelRunner, ModelRunner],
    setup: tuple[Config, Config],
    steering_demo: dict,
    graph_steps: list[int],
) -> None:
    """Both runners step the same steered and monitored rows; every step's logits and monitor reads agree."""
    rows = [steered_rows(runner, config, steering_demo) for runner, config in zip(runners, setup, strict=True)]
    schedulers = [Scheduler(scheduler_config(config, runner)) for runner, config in zip(runners, setup, strict=True)]
    for scheduler in schedulers:
        for i, prompt in enumerate(PROMPTS):
            scheduler.add(Request(f"r{i}", prompt, max_tokens=MAX_TOKENS))
    num_reads = 0
    while schedulers[1].has_work:
        batches = [scheduler.schedule() for scheduler in schedulers]
        graph, eager = (
            runner.run(batch, [by_id[chunk.request.request_id] for chunk in batch.chunks], None)
            for runner, batch, by_id in zip(runners, batches, rows, strict=True)
        )
        torch.testing.assert_close(graph.logits, eager.logits, **TOLERANCES[setup[0].dtype])
        is_monitored = any(chunk.request.request_id == "r2" for chunk in batches[1].chunks)
        assert graph.monitored.keys() == eager.monitored.keys() == ({"r2"} if is_monitored else set())
        graph_read, eager_read = graph.monitored.get("r2", []), eager.monitored.get("r2", [])
        assert [p.position for p in graph_read] == [p.position for p in eager_read]
        values = [[[value for _, value in p.features] for p in read] for read in (graph_read, eager_read)]
        torch.testing.assert_close(*(torch.tensor(v) for v in values), **TOLERANCES[setup[0].dtype])
        num_reads += len(graph_read)
        tokens = [[token] for token in eager.logits.argmax(-1).tolist()]
        for scheduler, batch in zip(schedulers, batches, strict=True):
            scheduler.update_from_output(batch, tokens)
    assert num_reads == len(PROMPTS[2]) + MAX_TOKENS - 1
    # the steered and monitored rows decoded in the graphs: r1's 24-token prompt takes two prefill chunks of 16, so the
    # three rows decode side by side for MAX_TOKENS - 2 steps, and r1 finishes alone
    assert graph_steps == [3] * (MAX_TOKENS - 2) + [1]
