"""Engine (iv): steerbatch's engine behind `worker.engine.interface.Engine`, fed at arrival times from a feeder thread.

Token times are stamped with `time.perf_counter()` in the output callback, which the engine calls from its own
thread as each step's tokens come out.
"""

from __future__ import annotations

import logging
import threading
import time

from bench.metrics import RequestTrace, RunResult
from bench.workload import BenchRequest, Feeder
from tasks.config import Config
from tasks.messages.generation import SamplingParams
from worker.engine.continuous_engine import ContinuousEngine
from worker.engine.graphs.graph_mode import GraphMode
from worker.engine.interface import EngineOutput, EngineRequest
from worker.engine.model_runner import ModelRunner
from worker.engine.stats import EngineStats

logger = logging.getLogger(__name__)

REQUEST_TIMEOUT_S = 600.0
POLL_S = 1.0


def build_engine(runner: ModelRunner, config: Config) -> tuple[ContinuousEngine, str]:
    """The engine under test and its table label."""
    label = "(iv) steerbatch ContinuousEngine" + (", torch.compile" if config.torch_compile else "")
    if runner.graph_mode is GraphMode.CAPTURE:
        label += ", CUDA graphs"
    elif runner.graph_mode is GraphMode.EAGER_REPLAY:
        label += ", graph steps replayed eagerly"
    return ContinuousEngine(runner, config), label


def engine_key(runner: ModelRunner, config: Config) -> str:
    if config.torch_compile:
        return "steerbatch_compiled"
    return "steerbatch" if runner.graph_mode is None else "steerbatch_graphs"


class _Collector:
    """One request's tokens and their times, as the engine thread delivers them."""

    def __init__(self) -> None:
        self.token_ids: list[int] = []
        self.token_times: list[float] = []
        self.error: str | None = None
        self.finished = threading.Event()

    def __call__(self, output: EngineOutput) -> None:
        now = time.perf_counter()
        self.token_ids.extend(output.new_token_ids)
        self.token_times.extend([now] * len(output.new_token_ids))
        if output.is_finished:
            self.error = output.error
            self.finished.set()


def wait_for(collector: _Collector, request_id: str, feeder: Feeder) -> None:
    deadline = time.perf_counter() + REQUEST_TIMEOUT_S
    while not collector.finished.wait(POLL_S):
        feeder.check()
        if time.perf_counter() > deadline:
            raise RuntimeError(f"{request_id} did not finish within {REQUEST_TIMEOUT_S:.0f}s")
    if collector.error is not None:
        raise RuntimeError(f"the engine failed {request_id}: {collector.error}")


class SteerbatchEngine:
    def __init__(self, runner: ModelRunner, config: Config) -> None:
        self._engine, self.label = build_engine(runner, config)
        self.key = engine_key(runner, config)
        self._engine.start()

    def run(self, workload: str, requests: list[BenchRequest]) -> RunResult:
        collectors = {request.request_id: _Collector() for request in requests}
        start = time.perf_counter()

        def submit(request: BenchRequest) -> None:
            sampling = SamplingParams(max_tokens=request.num_output_tokens, temperature=0.0, ignore_eos=True)
            engine_request = EngineRequest(request.request_id, request.prompt_token_ids, sampling)
            self._engine.submit(engine_request, collectors[request.request_id])

        feeder = Feeder(requests, start, submit)
        for request_id, collector in collectors.items():
            wait_for(collector, request_id, feeder)
        feeder.join()
        traces = [
            RequestTrace(request.request_id, start + request.arrival_s, collector.token_ids, collector.token_times)
            for request, collector in zip(requests, collectors.values(), strict=True)
        ]
        num_generated = sum(len(trace.token_ids) for trace in traces)
        return RunResult(self.key, self.label, workload, start, traces, num_generated)

    @property
    def stats(self) -> EngineStats:
        return self._engine.stats

    def close(self) -> None:
        self._engine.stop()
