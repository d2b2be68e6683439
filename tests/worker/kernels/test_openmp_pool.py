"""A thread's OpenMP team is handed back: `release_thread_pool` ends the worker threads a parallel region left
waiting, and starting an engine does it for the thread that loaded the model, so the engine's team is the only one
(worker/kernels/openmp_pool.py says why that matters)."""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from collections.abc import Iterator

import pytest
import torch

from tasks.config import Config
from worker.engine.continuous_engine import ContinuousEngine
from worker.engine.model_runner import ModelRunner
from worker.kernels.openmp_pool import release_thread_pool

NUM_THREADS = 2
WAIT_S = 10.0  # a bound for the threads' exit, not a speed target


@pytest.fixture
def two_torch_threads() -> Iterator[None]:
    previous = torch.get_num_threads()
    torch.set_num_threads(NUM_THREADS)
    yield
    torch.set_num_threads(previous)


def thread_ids() -> set[int]:
    return {int(name) for name in os.listdir("/proc/self/task")}


def run_parallel_region() -> None:
    torch.ones(1 << 22).add_(1)  # far above torch's grain size: both threads take part


def wait_until_gone(threads: set[int]) -> set[int]:
    deadline = time.monotonic() + WAIT_S
    while threads & thread_ids() and time.monotonic() < deadline:
        time.sleep(0.01)
    return threads & thread_ids()


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts threads through Linux's /proc")
def test_release_ends_the_calling_threads_team(two_torch_threads: None) -> None:
    before = thread_ids()
    released: list[set[int]] = []

    def work_then_release() -> None:
        run_parallel_region()
        team = thread_ids() - before - {threading.get_native_id()}
        assert len(team) == NUM_THREADS - 1, "the parallel region did not leave the team this test expects"
        assert release_thread_pool()
        released.append(wait_until_gone(team))

    worker = threading.Thread(target=work_then_release)
    worker.start()
    worker.join(WAIT_S)
    assert released == [set()], "the team's workers outlived the release"


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts threads through Linux's /proc")
def test_starting_an_engine_releases_the_loading_threads_team(two_torch_threads: None, tiny_config: Config) -> None:
    outcome: list[tuple[set[int], set[int]]] = []

    def load_and_start() -> None:
        config = dataclasses.replace(tiny_config, cpu_threads=NUM_THREADS)
        engine = ContinuousEngine(ModelRunner(config), config)
        release_thread_pool()  # whatever team the loading left, so that the next region's is known
        before = thread_ids()
        run_parallel_region()
        team = thread_ids() - before
        engine.start()
        outcome.append((team, wait_until_gone(team)))
        engine.stop(timeout_s=WAIT_S)

    loader = threading.Thread(target=load_and_start)
    loader.start()
    loader.join(120)
    [(team, left)] = outcome
    assert len(team) == NUM_THREADS - 1, "the parallel region did not leave the team this test expects"
    assert left == set(), "the loading thread's team outlived the engine's start"
