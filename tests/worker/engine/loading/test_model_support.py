"""worker/engine/loading/model_support.py: a model the engine would compute differently from HF is refused at load,
before its weights, with an error naming what is missing; every family it runs exactly loads."""

from __future__ import annotations

from pathlib import Path

import pytest
from transformers import AutoConfig

from tasks.config import Config
from tests.worker.family_configs import FAMILIES, family_config, write_family_model
from worker.engine.attention.backend import AttentionBackend
from worker.engine.loading.model_support import UnsupportedModelError, check_model_supported, unsupported_features
from worker.engine.model_runner import ModelRunner


@pytest.mark.parametrize("family", FAMILIES)
def test_every_family_of_the_table_is_supported(family: str) -> None:
    assert unsupported_features(family_config(family), 4096) == []


def test_a_variant_a_backend_lacks_is_named() -> None:
    with pytest.raises(UnsupportedModelError, match=r"attention sinks .* on the flash_attn backend"):
        check_model_supported("my-model", family_config("gpt_oss"), 1024, AttentionBackend.FLASH_ATTN)
    check_model_supported("my-model", family_config("gpt_oss"), 1024, AttentionBackend.TRITON)


@pytest.mark.parametrize(
    ("config", "missing"),
    [
        (AutoConfig.for_model("t5"), "encoder-decoder models"),
        (AutoConfig.for_model("bart"), "encoder-decoder models"),
        (AutoConfig.for_model("mllama"), "cross-attention"),  # a vision model's cross-attention layers in its text
        (family_config("gpt2", add_cross_attention=True), "cross-attention"),
        (AutoConfig.for_model("falcon"), "the model family 'falcon'"),
    ],
)
def test_models_of_other_shapes_are_refused_naming_why(config: AutoConfig, missing: str) -> None:
    with pytest.raises(UnsupportedModelError, match=f"my-model cannot be served exactly; the engine lacks: {missing}"):
        check_model_supported("my-model", config, 1024)


def test_rope_that_rescales_with_the_steps_longest_position_is_refused_past_its_original_context() -> None:
    rope = {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0}
    config = family_config("llama", rope_parameters=rope, max_position_embeddings=256)
    assert unsupported_features(config, 256) == []
    assert "dynamic RoPE past its original 256-token context" in unsupported_features(config, 512)[0]


def test_the_runner_refuses_before_loading_weights(tiny_model_dir: Path, tmp_path: Path) -> None:
    folder, _ = write_family_model("llama", tmp_path / "llama", tiny_model_dir, attention_chunk_size=8)
    (folder / "model.safetensors").unlink()  # a refusal that read the weights would fail on this instead
    with pytest.raises(UnsupportedModelError, match="chunked attention"):
        ModelRunner(Config(model=str(folder), device="cpu", kv_cache_tokens=256))


def test_soft_capped_attention_is_refused_on_cuda_and_served_on_cpu() -> None:
    config = family_config("gemma2")
    with pytest.raises(UnsupportedModelError, match="attention-logit soft-capping on CUDA"):
        check_model_supported("gemma-2", config, 1024, AttentionBackend.TRITON, "cuda")
    check_model_supported("gemma-2", config, 1024, AttentionBackend.TRITON, "cpu")
