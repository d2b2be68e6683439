"""torchao int8 weight-only under TORCH_COMPILE=1 on CPU: the compiled forward runs each linear on the int8 kernel
through its custom op, so greedy output is eager's token for token (before the op, every compiled step failed)."""

from __future__ import annotations

import dataclasses

import pytest

from tasks.config import Config
from tests.worker.engine.quantization.test_kv_cache_dtype import NUM_PROMPTS, greedy_tokens, random_prompts
from tests.worker.engine.test_compiled_forward import CountingCalls
from tests.worker.engine_harness import load_runner


@pytest.mark.slow  # inductor compiles the whole model: about a minute alone on an idle 2-core machine
@pytest.mark.timeout(1200)
def test_int8_weights_under_torch_compile_serve_what_eager_int8_weights_do(
    tiny_config: Config, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    prompts = random_prompts(NUM_PROMPTS, 11)
    eager_config = dataclasses.replace(tiny_config, quantization="torchao_int8")
    eager = greedy_tokens(load_runner(eager_config, stops_at_eos=False), eager_config, prompts, caplog)

    compiled_config = dataclasses.replace(eager_config, torch_compile=True)
    runner = load_runner(compiled_config, stops_at_eos=False)
    counting = CountingCalls(runner._compiled)
    monkeypatch.setattr(runner, "_compiled", counting)
    compiled = greedy_tokens(runner, compiled_config, prompts, caplog)

    assert counting.num_calls > 0  # steps ran through the compiled graph, not only eager
    assert compiled == eager
