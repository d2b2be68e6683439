"""The engine's load as the lease thread reads it from another thread: the batch, the waiting rows by priority and
the KV pool's usage, back to empty once everything ends."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator

import pytest

from tasks.config import Config
from tests.worker.engine_harness import TIMEOUT_S, Collector, greedy, serve
from worker.engine.continuous_engine import ContinuousEngine
from worker.engine.interface import BULK_PRIORITY, EngineRequest
from worker.engine.model_runner import ModelRunner
from worker.engine.stats import EngineLoad


@pytest.fixture
def one_row_engine(
    endless_runner: ModelRunner, tiny_config: Config, caplog: pytest.LogCaptureFixture
) -> Iterator[ContinuousEngine]:
    yield from serve(endless_runner, dataclasses.replace(tiny_config, max_num_seqs=1), caplog)


def wait_for_load(engine: ContinuousEngine, check: Callable[[EngineLoad], bool]) -> EngineLoad:
    deadline = time.monotonic() + TIMEOUT_S
    while not check(load := engine.load()):
        assert time.monotonic() < deadline, load
        time.sleep(0.01)
    return load


def test_load_counts_the_batch_the_waiting_rows_and_the_kv_pool(one_row_engine: ContinuousEngine) -> None:
    engine = one_row_engine
    collectors = {request_id: Collector() for request_id in ("bulk-1", "chat", "bulk-2")}
    for request_id, collector in collectors.items():
        priority = 0 if request_id == "chat" else BULK_PRIORITY
        engine.submit(EngineRequest(request_id, [1, 2, 3, 4], greedy(10_000), priority=priority), collector)
    load = wait_for_load(engine, lambda load: sum(load.num_waiting_by_priority.values()) == 2)
    assert load.num_running == 1 and 0 < load.kv_cache_usage < 1
    assert load.num_waiting_by_priority.get(BULK_PRIORITY, 0) >= 1  # one row runs: a bulk line waits either way

    for request_id, collector in collectors.items():
        engine.cancel(request_id)
        collector.wait()
    load = wait_for_load(engine, lambda load: load.num_running == 0)
    assert load.num_waiting_by_priority == {} and load.kv_cache_usage == 0.0
