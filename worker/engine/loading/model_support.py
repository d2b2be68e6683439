"""Refuses, from its config and before any weights load, a model the engine would not compute as HF does.

The engine runs HF's own modules but owns the attention over its KV pool and packs every request of a step into one
forward pass. A model is served only if each of those is exact for it: a decoder-only family whose layout the
steering hooks know, attention whose variant every backend implements, and positions that do not depend on what
else shares the step. Anything else is refused with an error naming what is missing, never answered differently.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from transformers import PretrainedConfig

from steering.model_layout import FAMILY_LAYOUTS
from worker.engine.attention.backend import AttentionBackend
from worker.engine.attention.layer_attention import unsupported_attention_variants

# RoPE types whose frequencies HF recomputes from the longest position in the forward pass: in a packed step that is
# another request's, so past the original context they would differ from HF's run of the request alone.
STEP_DEPENDENT_ROPE_TYPES = ("dynamic", "longrope")


class UnsupportedModelError(ValueError):
    """A model the engine cannot run exactly; the message names each missing piece."""


def check_model_supported(
    name: str,
    config: PretrainedConfig,
    max_model_len: int,
    backend: AttentionBackend | None = None,
    device_type: str | None = None,
) -> None:
    """Raises UnsupportedModelError naming everything about `config` the engine does not implement, for contexts of
    up to `max_model_len` tokens (on attention `backend` and a `device_type` device, when given)."""
    missing = unsupported_features(config, max_model_len, backend, device_type)
    if missing:
        raise UnsupportedModelError(f"{name} cannot be served exactly; the engine lacks: {'; '.join(missing)}")


def unsupported_features(
    config: PretrainedConfig,
    max_model_len: int,
    backend: AttentionBackend | None = None,
    device_type: str | None = None,
) -> list[str]:
    if getattr(config, "is_encoder_decoder", False):
        return [f"encoder-decoder models ({config.model_type} has an encoder; the engine runs decoder-only models)"]
    if getattr(config, "add_cross_attention", False) or getattr(
        config.get_text_config(), "cross_attention_layers", None
    ):
        return [f"cross-attention ({config.model_type} has cross-attention layers)"]
    if config.model_type not in FAMILY_LAYOUTS:
        known = ", ".join(sorted(FAMILY_LAYOUTS))
        return [f"the model family {config.model_type!r} (families the engine runs exactly: {known})"]
    # sliding windows, soft-caps, sinks and `scaling` are implemented in every backend's kernels; what is not, is here
    missing = unsupported_attention_variants(config, backend, device_type)
    return missing + step_dependent_positions(config, max_model_len)


def step_dependent_positions(config: PretrainedConfig, max_model_len: int) -> list[str]:
    missing = []
    for rope in rope_parameter_sets(getattr(config, "rope_parameters", None)):
        rope_type = str(rope.get("rope_type", "default"))
        original = int(rope.get("original_max_position_embeddings") or config.max_position_embeddings)
        if rope_type in STEP_DEPENDENT_ROPE_TYPES and max_model_len > original:
            missing.append(
                f"{rope_type} RoPE past its original {original}-token context (HF rescales it by the longest "
                f"position in a forward pass; set MAX_MODEL_LEN to at most {original})"
            )
    return missing


def rope_parameter_sets(rope_parameters: Mapping[str, Any] | None) -> list[Mapping[str, Any]]:
    """One RoPE parameter set, or one per layer type (Gemma 3: sliding and full attention)."""
    if not rope_parameters:
        return []
    if all(isinstance(value, Mapping) for value in rope_parameters.values()):
        return list(rope_parameters.values())
    return [rope_parameters]
