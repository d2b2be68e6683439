"""Quantized checkpoints made here with each library's own quantize path, served by the engine: greedy output equals
HF `generate` on the same quantized model, and steering, monitoring, the prefix cache and speculation run on one.
Every format whose kernels have a CPU path runs here; what has none is refused when the worker loads it."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, PreTrainedModel

from scripts.quantize_checkpoint import quantize_checkpoint
from steering.registry import SAERegistry
from steering.sae_math import steering_direction
from tasks.config import Config
from tasks.messages.steering import MonitorSpec
from tests.steering.sae_folders import TINY_SAE_ID
from tests.worker.engine.speculation.test_speculation import self_repeating_prompt
from tests.worker.engine.test_engine_monitoring import monitored, reference_acts
from tests.worker.engine.test_engine_steering import feature_spec, steered_reference
from tests.worker.engine_harness import greedy, hf_greedy, load_runner, run, serve, submit_together
from worker.engine.interface import EngineRequest
from worker.engine.loading.quantization import UnsupportedQuantizationError, torchao_int8

MAX_TOKENS = 10
PROMPTS = [list(range(20, 29)), list(range(300, 340, 3)), [7, 7, 7, 99, 100], list(range(1000, 1040))]
SERVED_ON_CPU = {
    "torchao_int8": "torchao:Int8WeightOnlyConfig",
    "torchao_int4": "torchao:IntxWeightOnlyConfig",
    "bitsandbytes_8bit": "bitsandbytes:8bit",
    "compressed_tensors_w8a8": "compressed-tensors:int-quantized",
    "compressed_tensors_w8a16": "compressed-tensors:pack-quantized",
    "compressed_tensors_w4a16": "compressed-tensors:pack-quantized",
    "compressed_tensors_fp8": "compressed-tensors:float-quantized",
}


def quantized_reference(model_dir: Path) -> PreTrainedModel:
    return AutoModelForCausalLM.from_pretrained(model_dir, device_map="cpu").eval()


# bitsandbytes' LLM.int8() gives a row numbers that depend on the rows beside it: the input columns it computes in
# float16 are those in which any row of the matmul holds an outlier, and even without one a row alone rounds
# differently from the same row in a batch (measured on its CPU path). So in HF's batched `generate` as in a step of
# ours; its reference is one request at a time, as HF's `generate` runs each prompt here.
BATCH_DEPENDENT = {"bitsandbytes_8bit"}


def served_greedy(
    config: Config, caplog: pytest.LogCaptureFixture, is_one_at_a_time: bool = False
) -> tuple[str, list[list[int]]]:
    """The loaded quantization's name and the engine's greedy tokens for PROMPTS, all submitted at once (or one at a
    time)."""
    runner = load_runner(config, stops_at_eos=False)
    serving = serve(runner, config, caplog)
    engine = next(serving)
    requests = [EngineRequest(f"req-{i}", prompt, greedy(MAX_TOKENS)) for i, prompt in enumerate(PROMPTS)]
    if is_one_at_a_time:
        tokens = [
            run(engine, request.request_id, request.prompt_token_ids, request.sampling).token_ids
            for request in requests
        ]
    else:
        tokens = [collector.token_ids for collector in submit_together(engine, requests)]
    next(serving, None)
    return runner.quantization.name, tokens


@pytest.mark.parametrize("method", list(SERVED_ON_CPU))
def test_a_quantized_checkpoint_serves_what_hf_generates_with_it(
    method: str, tiny_config: Config, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    checkpoint = quantize_checkpoint(Path(tiny_config.model), method, tmp_path / method)
    reference = quantized_reference(checkpoint)
    expected = [hf_greedy(reference, frozenset(), prompt, MAX_TOKENS) for prompt in PROMPTS]
    config = dataclasses.replace(tiny_config, model=str(checkpoint))
    name, tokens = served_greedy(config, caplog, is_one_at_a_time=method in BATCH_DEPENDENT)
    assert name == SERVED_ON_CPU[method]
    assert tokens == expected


def test_a_float_checkpoint_quantized_as_it_loads_serves_what_hf_generates_with_it(
    tiny_config: Config, caplog: pytest.LogCaptureFixture
) -> None:
    reference = AutoModelForCausalLM.from_pretrained(
        tiny_config.model, dtype=torch.float32, quantization_config=torchao_int8(), device_map="cpu"
    )
    expected = [hf_greedy(reference, frozenset(), prompt, MAX_TOKENS) for prompt in PROMPTS]
    name, tokens = served_greedy(dataclasses.replace(tiny_config, quantization="torchao_int8"), caplog)
    assert (name, tokens) == ("torchao:int8_weight_only", expected)


def test_bitsandbytes_4bit_is_refused_on_cpu_where_its_kernel_cannot_read_the_widths(tiny_config: Config) -> None:
    with pytest.raises(UnsupportedQuantizationError, match=r"multiples of 64; \S+down_proj has 352"):
        load_runner(dataclasses.replace(tiny_config, quantization="bitsandbytes_4bit"))


@pytest.mark.usefixtures("tiny_sae_root")
def test_steering_monitoring_prefix_cache_and_speculation_run_on_a_quantized_model(
    tiny_config: Config, tmp_path: Path, steering_demo: dict, caplog: pytest.LogCaptureFixture
) -> None:
    checkpoint = quantize_checkpoint(Path(tiny_config.model), "torchao_int8", tmp_path / "int8")
    reference = quantized_reference(checkpoint)
    config = dataclasses.replace(tiny_config, model=str(checkpoint))
    serving = serve(load_runner(config, stops_at_eos=False), config, caplog)
    engine = next(serving)
    sae = SAERegistry(Path(tiny_config.sae_root)).get(TINY_SAE_ID)

    steered = run(engine, "steered", PROMPTS[0], greedy(MAX_TOKENS), feature_spec(steering_demo, 0))
    feature = steering_demo["features"][0]
    delta = steering_direction(sae, [(feature["index"], feature["strength"])])
    assert steered.token_ids == steered_reference(reference, delta, PROMPTS[0], MAX_TOKENS)

    watched = run(engine, "watched", PROMPTS[3], greedy(MAX_TOKENS), monitor=MonitorSpec(TINY_SAE_ID, top_k=3))
    sequence = PROMPTS[3] + watched.token_ids[:-1]
    expected_values, expected_indices = reference_acts(reference, sae, sequence).topk(3, dim=-1)
    positions = monitored(watched)
    assert [[index for index, _ in p.features] for p in positions] == expected_indices.tolist()
    assert torch.allclose(torch.tensor([[v for _, v in p.features] for p in positions]), expected_values, atol=1e-4)

    again = run(engine, "again", PROMPTS[3], greedy(MAX_TOKENS))
    assert again.outputs[-1].num_cached_tokens == 32  # the prompt's two full blocks of 16
    assert again.token_ids == hf_greedy(reference, frozenset(), PROMPTS[3], MAX_TOKENS)

    repeating = self_repeating_prompt(reference, 0)
    assert run(engine, "spec", repeating, greedy(24)).token_ids == hf_greedy(reference, frozenset(), repeating, 24)
    assert engine.stats.num_proposed_tokens > 0
    next(serving, None)
