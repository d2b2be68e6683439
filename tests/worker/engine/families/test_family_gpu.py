"""Every family the engine serves, on a CUDA device (`gpu` marker; the GPU check's step b), through the worker's CUDA
path (the Triton kernels, decode steps in CUDA graphs): greedy tokens equal HF `generate` on the same device in float32
(chunked prefill, batched lengths, a prefix-cache hit, speculative verify chunks; past the window for the sliding
families), and in bfloat16 where float32's top token leads clearly (tests/worker/greedy_cases.py), so that bfloat16's
rounding cannot flip one. On a CPU the same families are checked by test_family_greedy.py and
test_engine_attention_variants.py on every CPU backend."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from transformers import PreTrainedModel

from tests.worker.engine.attention.test_engine_attention_variants import (
    PROMPTS as VARIANT_PROMPTS,
)
from tests.worker.engine.attention.test_engine_attention_variants import (
    SHARED_PREFIX,
    VARIANT_OVERRIDES,
    engine_over,
    greedy_tokens,
)
from tests.worker.engine.families.test_family_greedy import PROMPTS, check_family_matches_hf, family_config
from tests.worker.engine.families.test_greedy_dtypes import engine_greedy
from tests.worker.engine_harness import hf_greedy, load_runner
from tests.worker.family_configs import LLAMA_SHAPED_FAMILIES, MOE_FAMILIES, OTHER_LAYOUT_FAMILIES, write_family_model
from tests.worker.greedy_cases import MIN_RUN, clear_cases
from worker.engine.graphs.graph_mode import has_routed_experts
from worker.engine.loading.model_support import UnsupportedModelError

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]
FAMILIES = OTHER_LAYOUT_FAMILIES + LLAMA_SHAPED_FAMILIES + MOE_FAMILIES
VARIANT_FAMILIES = ("mistral", "gemma3_text", "gpt_oss")  # gemma2: its soft-cap is refused on CUDA (below)
MAX_TOKENS = 12


@pytest.mark.parametrize("family", FAMILIES)
def test_float32_greedy_equals_hf_generate_on_cuda(
    family: str, family_models: dict[str, tuple[Path, PreTrainedModel]], caplog: pytest.LogCaptureFixture
) -> None:
    folder, reference = family_models[family]
    config = family_config(folder, "auto", device="cuda")
    runner = load_runner(config, stops_at_eos=False)
    assert runner.attention_backend.value == "triton"
    assert (runner.graph_mode is None) == has_routed_experts(reference.config)  # MoE steps cannot be captured
    check_family_matches_hf(runner, config, reference.to("cuda"), caplog)


@pytest.mark.parametrize("family", VARIANT_FAMILIES)
def test_float32_greedy_equals_hf_generate_past_the_window_on_cuda(
    family: str, tmp_path: Path, tiny_model_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    folder, reference = write_family_model(family, tmp_path / family, tiny_model_dir, **VARIANT_OVERRIDES[family])
    reference = reference.to("cuda")
    for engine, runner in engine_over(folder, "auto", caplog, device="cuda"):
        assert runner.attention_backend.value == "triton"
        assert (runner.graph_mode is None) == has_routed_experts(reference.config)
        expected = [hf_greedy(reference, frozenset(), prompt, MAX_TOKENS) for prompt in VARIANT_PROMPTS]
        assert greedy_tokens(engine, VARIANT_PROMPTS) == expected  # batched, each past the window
        assert greedy_tokens(engine, [SHARED_PREFIX]) == [hf_greedy(reference, frozenset(), SHARED_PREFIX, MAX_TOKENS)]


def test_a_soft_capped_model_is_refused_on_cuda(tmp_path: Path, tiny_model_dir: Path) -> None:
    folder, _ = write_family_model("gemma2", tmp_path / "gemma2", tiny_model_dir)
    with pytest.raises(UnsupportedModelError, match="attention-logit soft-capping on CUDA"):
        load_runner(family_config(folder, "auto", device="cuda"))


@pytest.mark.parametrize("family", FAMILIES + VARIANT_FAMILIES)
def test_bfloat16_greedy_equals_hf_generate_where_float32_leads_clearly(
    family: str, tmp_path: Path, tiny_model_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    overrides = VARIANT_OVERRIDES.get(family, {})
    folder, reference = write_family_model(family, tmp_path / family, tiny_model_dir, **overrides)
    cases = clear_cases(reference.to("cuda"), [*PROMPTS, *VARIANT_PROMPTS])
    if not cases:
        pytest.skip(f"no run of {MIN_RUN} clear steps in this {family} model's float32 greedy text")
    float32_tokens = [hf_greedy(reference, frozenset(), prompt, length) for prompt, length in cases]
    bfloat16_reference = copy.deepcopy(reference).to(torch.bfloat16)
    expected = [hf_greedy(bfloat16_reference, frozenset(), prompt, length) for prompt, length in cases]
    assert expected == float32_tokens  # the margins held under HF's own bfloat16
    config = family_config(folder, "auto", device="cuda", dtype="bfloat16")
    extended, lengths = [prompt for prompt, _ in cases], [length for _, length in cases]
    assert engine_greedy(config, extended, lengths, caplog) == expected
