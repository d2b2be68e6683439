"""The families whose attention has no variant (no window, soft-cap or sink) decode greedily what HF `generate` does on
the same weights, in float32, on every CPU attention backend (the C decode kernel, the SDPA path, the Triton kernels
under the interpreter): those not shaped like Llama (GPT-2's Conv1D and learned positions, GPT-NeoX's partial rotary
and parallel residual, OPT's positions offset by 2, Gemma's scaled embeddings), the Llama-shaped ones (Granite's
attention multiplier reaches the kernels as their scale) and the MoE ones. Prompts prefilled in several chunks, alone
and batched with other lengths, with a prefix-cache hit and speculative verify chunks. The families that slide,
soft-cap or sink are checked the same way, past their windows, in test_engine_attention_variants.py."""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path

import pytest
from transformers import PreTrainedModel

from tasks.config import Config
from tests.worker.engine_harness import greedy, hf_greedy, load_runner, serve, submit_at_once
from tests.worker.family_configs import LLAMA_SHAPED_FAMILIES, MOE_FAMILIES, OTHER_LAYOUT_FAMILIES
from worker.engine.continuous_engine import ContinuousEngine
from worker.engine.interface import EngineRequest
from worker.engine.model_runner import ModelRunner

BACKENDS = ("cpu_kernel", "sdpa", "triton")
# Under the interpreter a Triton case takes 5-15 s. By default Triton runs the families that reach its kernels in
# different ways: grouped-query heads (Llama), a scale other than 1/sqrt(d) (Granite), one KV head per query head and
# learned positions (GPT-2), and experts between the attentions (Mixtral). The rest differ from these only outside
# attention; they run on Triton under `pytest -m slow`, and on the C kernel and SDPA always.
TRITON_BY_DEFAULT = {"llama", "granite", "gpt2", "mixtral"}


def is_slow_case(params: dict[str, object]) -> bool:
    return params.get("backend") == "triton" and params.get("family") not in TRITON_BY_DEFAULT


CHUNK = 16  # prefill chunk and KV block: the prompts below cross both
_rng = random.Random(26)
PREFIX = [_rng.randrange(6, 2048) for _ in range(20)]  # one full block: the second prompt finds it cached
LONG = [_rng.randrange(6, 2048) for _ in range(45)]  # three prefill chunks
PROMPTS = [[*PREFIX, 7, 8, 9], [*PREFIX, 11, 12], LONG, [300]]
MAX_TOKENS = 8


def family_config(folder: Path, backend: str, device: str = "cpu", dtype: str = "float32") -> Config:
    return Config(
        model=str(folder),
        device=device,
        dtype=dtype,
        max_num_seqs=8,
        kv_cache_tokens=2048,
        kv_block_size=CHUNK,
        prefill_chunk_size=CHUNK,
        max_num_batched_tokens=2 * CHUNK,
        attention_backend=backend,
    )


def engine_outputs(engine: ContinuousEngine) -> tuple[list[list[int]], list[int]]:
    """Each prompt's greedy tokens and cached prompt tokens: the first prompt alone (so that its prefix is cached),
    the rest admitted in one step; every request self-drafts, so that verify chunks run too."""
    sampling = dataclasses.replace(greedy(MAX_TOKENS), speculative_method="self")
    requests = [EngineRequest(f"req-{i}", prompt, sampling) for i, prompt in enumerate(PROMPTS)]
    collectors = submit_at_once(engine, requests[:1]) + submit_at_once(engine, requests[1:])
    tokens = [collector.token_ids for collector in collectors]
    return tokens, [collector.outputs[-1].num_cached_tokens for collector in collectors]


def check_family_matches_hf(
    runner: ModelRunner, config: Config, reference: PreTrainedModel, caplog: pytest.LogCaptureFixture
) -> None:
    serving = serve(runner, config, caplog)
    engine = next(serving)
    tokens, cached = engine_outputs(engine)
    stats = engine.stats
    next(serving, None)  # stops the engine and checks no block leaked
    assert tokens == [hf_greedy(reference, frozenset(), prompt, MAX_TOKENS) for prompt in PROMPTS]
    assert cached[1] >= CHUNK  # the shared prefix's full block came from the cache
    assert stats.num_verifications > 0 and stats.max_batch_size_seen == len(PROMPTS) - 1
    for layer in range(runner.kv_pool.cache.shape[0]):  # every layer wrote its K/V through our attention
        assert runner.kv_pool.cache[layer].abs().sum() > 0, f"layer {layer} never reached the paged attention"


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("family", OTHER_LAYOUT_FAMILIES + LLAMA_SHAPED_FAMILIES + MOE_FAMILIES)
def test_families_without_attention_variants_decode_as_hf_on_every_backend(
    family: str,
    backend: str,
    family_models: dict[str, tuple[Path, PreTrainedModel]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    folder, reference = family_models[family]
    config = family_config(folder, backend)
    runner = load_runner(config, stops_at_eos=False)
    assert runner.attention_backend.value == backend
    check_family_matches_hf(runner, config, reference, caplog)
