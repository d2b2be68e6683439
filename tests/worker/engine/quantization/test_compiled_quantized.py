"""KV_CACHE_DTYPE=int8, and torchao int8 weights, under TORCH_COMPILE=1 on CPU: the compiled forward reads and
writes the same int8 KV codes as eager, and runs each int8 linear on the kernel through its custom op
(`steerbatch::int8_weight_linear`; before it, every compiled step failed), so greedy output is eager's token for
token."""

from __future__ import annotations

import dataclasses
import logging
import multiprocessing
from concurrent.futures import ProcessPoolExecutor

import pytest

from tasks.config import Config
from tests.worker.engine.quantization.test_kv_cache_dtype import NUM_PROMPTS, greedy_tokens, random_prompts
from tests.worker.engine.test_compiled_forward import CountingCalls
from tests.worker.engine_harness import load_runner


def eager_and_compiled_tokens(
    config: Config, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> tuple[list[list[int]], list[list[int]], int]:
    """Greedy tokens of the same prompts, eager then compiled, and how many steps ran through the compiled graph."""
    prompts = random_prompts(NUM_PROMPTS, 7)
    eager = greedy_tokens(load_runner(config, stops_at_eos=False), config, prompts, caplog)
    compiled_config = dataclasses.replace(config, torch_compile=True)
    runner = load_runner(compiled_config, stops_at_eos=False)
    if compiled_config.kv_cache_dtype == "int8":
        assert runner.kv_pool.kernel_codes is not None  # the pool holds int8 codes under the compiled forward too
    counting = CountingCalls(runner._compiled)
    monkeypatch.setattr(runner, "_compiled", counting)
    return eager, greedy_tokens(runner, compiled_config, prompts, caplog), counting.num_calls


@pytest.mark.slow  # inductor compiles the whole model again for the int8 pool: 80 s alone on an idle 2-core machine
@pytest.mark.timeout(1200)  # inductor's compile at load: over 300 s on the 2-core machine at a load average of 8
def test_int8_kv_under_torch_compile_serves_what_eager_int8_kv_does(
    tiny_config: Config, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = dataclasses.replace(tiny_config, kv_cache_dtype="int8")
    eager, compiled, num_compiled_calls = eager_and_compiled_tokens(config, caplog, monkeypatch)
    assert num_compiled_calls > 0  # steps ran through the compiled graph, not only eager
    assert compiled == eager


def _int8_weights_in_a_fresh_process(config: Config) -> tuple[list[list[int]], list[list[int]], int]:
    records = _LogRecords()
    logging.getLogger().addHandler(records)
    with pytest.MonkeyPatch.context() as monkeypatch:
        return eager_and_compiled_tokens(config, records, monkeypatch)  # type: ignore[arg-type]


class _LogRecords(logging.Handler):
    """What greedy_tokens reads of pytest's caplog, outside pytest: the records logged, an engine's errors among them
    (which fail it)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def clear(self) -> None:
        self.records = []


@pytest.mark.slow  # a fresh process compiles the whole model: about a minute on an idle 2-core machine
@pytest.mark.timeout(1200)
def test_int8_weights_under_torch_compile_serve_what_eager_int8_weights_do(tiny_config: Config) -> None:
    """In a process of its own: a process compiles one architecture (compiled_forward.py), and this process may have
    compiled the float model already."""
    config = dataclasses.replace(tiny_config, quantization="torchao_int8")
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        eager, compiled, num_compiled_calls = pool.submit(_int8_weights_in_a_fresh_process, config).result()
    assert num_compiled_calls > 0  # steps ran through the compiled graph, not only eager
    assert compiled == eager
