"""worker/engine/model_support.py: a model the engine would compute differently from HF is refused at load, before
its weights, with an error naming what is missing; every family it runs exactly loads."""

from __future__ import annotations

from pathlib import Path

import pytest
from transformers import AutoConfig

from tasks.config import Config
from tests.worker.family_configs import family_config, write_family_model
from worker.engine.model_runner import ModelRunner
from worker.engine.model_support import UnsupportedModelError, check_model_supported, unsupported_features

SERVED_BY_DEFAULT = ("llama", "mixtral", "qwen3_moe", "qwen2", "qwen3", "gemma", "phi3", "olmo2", "granite")
SERVED_BY_DEFAULT += ("gpt2", "gpt_neox", "opt")


@pytest.mark.parametrize("family", SERVED_BY_DEFAULT)
def test_families_without_unimplemented_variants_are_supported(family: str) -> None:
    assert unsupported_features(family_config(family), 4096) == []


@pytest.mark.parametrize(
    ("family", "missing"),
    [
        ("mistral", ["sliding-window attention (a 16-token window on layers 0, 1, 2, 3"]),
        ("gemma2", ["sliding-window attention (a 16-token window on layers 0, 2,", "soft-capping"]),
        ("gemma3_text", ["sliding-window attention (a 16-token window on layers 0, 1, 2, 3, 4,"]),
        ("gpt_oss", ["sliding-window attention (a 16-token window on layers 0, 2,", "attention sinks"]),
    ],
)
def test_attention_variants_the_backends_lack_are_named(family: str, missing: list[str]) -> None:
    found = unsupported_features(family_config(family), 1024)
    assert len(found) == len(missing)
    assert all(text in message for text, message in zip(missing, found, strict=True))


def test_a_window_no_context_can_pass_is_served_as_full_attention() -> None:
    assert unsupported_features(family_config("mistral"), 16) == []
    assert unsupported_features(family_config("mistral"), 17) != []


@pytest.mark.parametrize(
    ("config", "missing"),
    [
        (AutoConfig.for_model("t5"), "encoder-decoder models"),
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
    folder, _ = write_family_model("mistral", tmp_path / "mistral", tiny_model_dir)
    (folder / "model.safetensors").unlink()  # a refusal that read the weights would fail on this instead
    with pytest.raises(UnsupportedModelError, match="sliding-window attention"):
        ModelRunner(Config(model=str(folder), device="cpu", kv_cache_tokens=256))
