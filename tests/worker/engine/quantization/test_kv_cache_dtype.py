"""The engine over a quantized KV pool (KV_CACHE_DTYPE): int8 keeps the float pool's greedy output, every backend
decodes the same tokens from the same codes, and the prefix cache, speculation and steering work over codes as over
floats. The pool's bytes per token are the codes' (and int8's scales), so the same bytes hold ~4x float32's tokens."""

from __future__ import annotations

import dataclasses
import random

import pytest
import torch
from transformers import PreTrainedTokenizerBase

from tasks.config import Config
from tests.worker.engine.test_engine_prefix_cache import turns
from tests.worker.engine.test_engine_steering import chat_prompt, feature_spec
from tests.worker.engine_harness import greedy, load_runner, run, serve, submit_together
from worker.engine.attention.kv_pool import KVShape, num_pool_tokens
from worker.engine.interface import EngineRequest
from worker.engine.model_runner import ModelRunner
from worker.kernels.kv_quant import KVCacheDtype, resolve_kv_cache_dtype

MAX_TOKENS = 16
NUM_PROMPTS = 12
MIN_INT8_AGREEMENT = 0.95  # the target against float32 KV (measured 1.0 on these prompts)
MIN_FP8_AGREEMENT = 0.8  # e4m3 keeps 3 mantissa bits: the tiny model's argmax flips more often (measured 0.91)


def random_prompts(num: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(5, 2000) for _ in range(rng.randint(5, 60))] for _ in range(num)]


def greedy_tokens(
    runner: ModelRunner, config: Config, prompts: list[list[int]], caplog: pytest.LogCaptureFixture
) -> list[list[int]]:
    serving = serve(runner, config, caplog)
    engine = next(serving)
    requests = [EngineRequest(f"req-{i}", prompt, greedy(MAX_TOKENS)) for i, prompt in enumerate(prompts)]
    tokens = [collector.token_ids for collector in submit_together(engine, requests)]
    next(serving, None)
    return tokens


def agreement(reference: list[list[int]], tokens: list[list[int]]) -> float:
    pairs = [(a, b) for ref, out in zip(reference, tokens, strict=True) for a, b in zip(ref, out, strict=True)]
    return sum(a == b for a, b in pairs) / len(pairs)


@pytest.fixture(scope="module")
def int8_config(tiny_config: Config) -> Config:
    return dataclasses.replace(tiny_config, kv_cache_dtype="int8")


@pytest.fixture(scope="module")
def int8_runner(int8_config: Config) -> ModelRunner:
    return load_runner(int8_config, stops_at_eos=False)


def test_int8_kv_keeps_the_float_pools_greedy_output_and_every_backend_decodes_the_same_codes_alike(
    int8_runner: ModelRunner,
    int8_config: Config,
    endless_runner: ModelRunner,
    tiny_config: Config,
    caplog: pytest.LogCaptureFixture,
) -> None:
    prompts = random_prompts(NUM_PROMPTS, 0)
    reference = greedy_tokens(endless_runner, tiny_config, prompts, caplog)
    assert int8_runner.kv_pool.cache.dtype == torch.int8 and int8_runner.kv_pool.kernel_codes is not None
    kernel_tokens = greedy_tokens(int8_runner, int8_config, prompts, caplog)
    assert agreement(reference, kernel_tokens) >= MIN_INT8_AGREEMENT
    for backend in ("sdpa", "triton"):
        config = dataclasses.replace(int8_config, attention_backend=backend)
        runner = load_runner(config, stops_at_eos=False)
        assert runner.attention_backend.value == backend
        subset = 3 if backend == "triton" else NUM_PROMPTS  # the interpreter runs a program at a time
        assert greedy_tokens(runner, config, prompts[:subset], caplog) == kernel_tokens[:subset]


def test_fp8_kv_serves_close_to_the_float_pool(
    endless_runner: ModelRunner, tiny_config: Config, caplog: pytest.LogCaptureFixture
) -> None:
    prompts = random_prompts(NUM_PROMPTS, 0)
    reference = greedy_tokens(endless_runner, tiny_config, prompts, caplog)
    config = dataclasses.replace(tiny_config, kv_cache_dtype="fp8_e4m3")
    runner = load_runner(config, stops_at_eos=False)
    assert runner.kv_pool.cache.dtype == torch.uint8 and runner.kv_cache_dtype_name == "fp8_e4m3"
    assert agreement(reference, greedy_tokens(runner, config, prompts, caplog)) >= MIN_FP8_AGREEMENT


@pytest.mark.parametrize("backend", ["cpu_kernel", "sdpa"])
def test_the_prefix_cache_serves_int8_blocks_as_recomputing_them_would(
    backend: str, int8_config: Config, caplog: pytest.LogCaptureFixture
) -> None:
    """A request whose system prompt's blocks come from the cache decodes what it decodes with the cache off: the
    first chunk of a quantized pool attends over its stored codes, as a later chunk over cached ones does."""
    outputs = {}
    for is_caching in (True, False):
        config = dataclasses.replace(int8_config, attention_backend=backend, enable_prefix_caching=is_caching)
        runner = load_runner(config, stops_at_eos=False)
        serving = serve(runner, config, caplog)
        engine = next(serving)
        run(engine, "warm", turns(1, seed=0)[0], greedy(4))
        prompts = turns(4, seed=1)
        requests = [EngineRequest(f"turn-{i}", prompt, greedy(8)) for i, prompt in enumerate(prompts)]
        collectors = submit_together(engine, requests)
        cached = [collector.outputs[-1].num_cached_tokens for collector in collectors]
        assert cached == [96 if is_caching else 0] * len(prompts)
        outputs[is_caching] = [collector.token_ids for collector in collectors]
        next(serving, None)
    assert outputs[True] == outputs[False]


def test_speculation_over_int8_kv_rolls_back_to_the_plain_greedy_output(
    int8_runner: ModelRunner, int8_config: Config, caplog: pytest.LogCaptureFixture
) -> None:
    """Self-drafting proposes at every step; rejected tokens' codes and scales are overwritten by the next step."""
    prompts = random_prompts(3, 2)
    plain = greedy_tokens(int8_runner, int8_config, prompts, caplog)
    serving = serve(int8_runner, int8_config, caplog)
    engine = next(serving)
    sampling = dataclasses.replace(greedy(MAX_TOKENS), speculative_method="self")
    requests = [EngineRequest(f"spec-{i}", prompt, sampling) for i, prompt in enumerate(prompts)]
    speculated = [collector.token_ids for collector in submit_together(engine, requests)]
    stats = engine.stats
    next(serving, None)
    assert stats.num_proposed_tokens > stats.num_accepted_tokens > 0  # both kept and rolled-back proposals
    assert speculated == plain


@pytest.mark.usefixtures("tiny_sae_root")
def test_steering_over_int8_kv_turns_toward_its_feature_as_over_float_kv(
    int8_runner: ModelRunner,
    int8_config: Config,
    endless_runner: ModelRunner,
    tiny_config: Config,
    tokenizer: PreTrainedTokenizerBase,
    steering_demo: dict,
    caplog: pytest.LogCaptureFixture,
) -> None:
    prompt = chat_prompt(tokenizer, "tell me about dogs")
    steered = {}
    for name, runner, config in (("int8", int8_runner, int8_config), ("float", endless_runner, tiny_config)):
        serving = serve(runner, config, caplog)
        engine = next(serving)
        steered[name] = run(engine, name, prompt, greedy(10), feature_spec(steering_demo, 0)).token_ids
        next(serving, None)
    assert steered["int8"][0] == steering_demo["features"][0]["token_id"]
    assert agreement([steered["float"]], [steered["int8"]]) >= MIN_INT8_AGREEMENT


@pytest.mark.parametrize(("head_dim", "float16_ratio"), [(32, 64 / 36), (128, 256 / 132)])
def test_the_same_bytes_hold_the_codes_share_more_tokens(head_dim: int, float16_ratio: float) -> None:
    """int8 stores D bytes and a float32 scale per head, K and V; fp8 D bytes (its scales are per layer)."""
    shape = KVShape(num_layers=4, num_kv_heads=2, head_dim=head_dim)
    per_token = {kind: shape.bytes_per_token(torch.float16, kind) for kind in KVCacheDtype}
    assert per_token[KVCacheDtype.AUTO] / per_token[KVCacheDtype.INT8] == pytest.approx(float16_ratio)
    assert per_token[KVCacheDtype.AUTO] / per_token[KVCacheDtype.FP8_E4M3] == 2
    float32 = shape.bytes_per_token(torch.float32)
    assert float32 / shape.bytes_per_token(torch.float32, KVCacheDtype.INT8) == pytest.approx(2 * float16_ratio)
    # sized by memory (a context no pool holds), the token counts follow the bytes per token
    config = Config(max_num_seqs=1)
    tokens = [
        num_pool_tokens(config, size, torch.device("cpu"), 10**12) for size in (float32, per_token[KVCacheDtype.INT8])
    ]
    ratio = float32 / per_token[KVCacheDtype.INT8]
    assert tokens[1] / tokens[0] == pytest.approx(ratio, rel=0.05)  # free RAM may move between the two reads


def test_the_runner_reports_its_kv_dtype_and_capacity(int8_runner: ModelRunner, int8_config: Config) -> None:
    assert int8_runner.kv_cache_dtype_name == "int8"
    assert int8_runner.kv_pool.num_tokens == int8_config.kv_cache_tokens
    shape = KVShape.of(int8_runner.model.config)
    bytes_per_token = shape.bytes_per_token(torch.float32, KVCacheDtype.INT8)
    assert int8_runner.kv_pool.num_bytes == bytes_per_token * int8_config.kv_cache_tokens


def test_an_unknown_kv_cache_dtype_is_refused_naming_the_choices() -> None:
    with pytest.raises(ValueError, match="KV_CACHE_DTYPE 'int4' is not one of auto, int8, fp8_e4m3"):
        resolve_kv_cache_dtype("int4")
