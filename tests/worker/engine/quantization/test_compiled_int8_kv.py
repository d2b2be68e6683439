"""KV_CACHE_DTYPE=int8 under TORCH_COMPILE=1 on CPU: the compiled forward reads and writes the same int8 codes as
eager, so greedy output is the same token for token."""

from __future__ import annotations

import dataclasses

import pytest

from tasks.config import Config
from tests.worker.engine.quantization.test_kv_cache_dtype import NUM_PROMPTS, greedy_tokens, random_prompts
from tests.worker.engine.test_compiled_forward import CountingCalls
from tests.worker.engine_harness import load_runner


@pytest.mark.slow  # inductor compiles the whole model again for the int8 pool: 80 s alone on an idle 2-core machine
@pytest.mark.timeout(1200)  # inductor's compile at load: over 300 s on the 2-core machine at a load average of 8
def test_int8_kv_under_torch_compile_serves_what_eager_int8_kv_does(
    tiny_config: Config, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    prompts = random_prompts(NUM_PROMPTS, 7)
    eager_config = dataclasses.replace(tiny_config, kv_cache_dtype="int8")
    eager = greedy_tokens(load_runner(eager_config, stops_at_eos=False), eager_config, prompts, caplog)

    compiled_config = dataclasses.replace(eager_config, torch_compile=True)
    runner = load_runner(compiled_config, stops_at_eos=False)
    assert runner.kv_pool.kernel_codes is not None  # the pool holds int8 codes under the compiled forward too
    counting = CountingCalls(runner._compiled)
    monkeypatch.setattr(runner, "_compiled", counting)
    compiled = greedy_tokens(runner, compiled_config, prompts, caplog)

    assert counting.num_calls > 0  # steps ran through the compiled graph, not only eager
    assert compiled == eager
