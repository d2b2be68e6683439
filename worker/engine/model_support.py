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

# RoPE types whose frequencies HF recomputes from the longest position in the forward pass: in a packed step that is
# another request's, so past the original context they would differ from HF's run of the request alone.
STEP_DEPENDENT_ROPE_TYPES = ("dynamic", "longrope")


class UnsupportedModelError(ValueError):
    """A model the engine cannot run exactly; the message names each missing piece."""


def check_model_supported(name: str, config: PretrainedConfig, max_model_len: int) -> None:
    """Raises UnsupportedModelError naming everything about `config` the engine does not implement, for contexts of
    up to `max_model_len` tokens."""
    missing = unsupported_features(config, max_model_len)
    if missing:
        raise UnsupportedModelError(f"{name} cannot be served exactly; the engine lacks: {'; '.join(missing)}")


def unsupported_features(config: PretrainedConfig, max_model_len: int) -> list[str]:
    if getattr(config, "is_encoder_decoder", False):
        return [f"encoder-decoder models ({config.model_type} has an encoder; the engine runs decoder-only models)"]
    if getattr(config, "add_cross_attention", False):
        return [f"cross-attention ({config.model_type} has cross-attention layers, add_cross_attention=True)"]
    if config.model_type not in FAMILY_LAYOUTS:
        known = ", ".join(sorted(FAMILY_LAYOUTS))
        return [f"the model family {config.model_type!r} (families the engine runs exactly: {known})"]
    return attention_variants_not_implemented(config, max_model_len) + step_dependent_positions(config, max_model_len)


def attention_variants_not_implemented(config: PretrainedConfig, max_model_len: int) -> list[str]:
    """The one place that decides which attention variants the backends (C kernel, SDPA, Triton, flash-attn) do not
    implement. They attend to every earlier token of a row, scaled by the model's `scaling`: a sliding window that a
    context can pass, logit soft-capping and attention sinks are not implemented."""
    missing = []
    window, sliding = getattr(config, "sliding_window", None), sliding_layers(config)
    if window is not None and sliding and max_model_len > window:
        missing.append(
            f"sliding-window attention (a {window}-token window on layers {format_layers(sliding)}, which contexts of "
            f"up to {max_model_len} tokens pass; with MAX_MODEL_LEN at most {window} the window never drops a token)"
        )
    softcap = getattr(config, "attn_logit_softcapping", None)
    if softcap is not None:
        missing.append(f"attention-logit soft-capping (attn_logit_softcapping={softcap})")
    if config.model_type == "gpt_oss":
        missing.append("attention sinks (gpt_oss's learned per-head sink logits)")
    return missing


def sliding_layers(config: PretrainedConfig) -> list[int]:
    """The layers HF runs with a sliding window: those `layer_types` marks, or every layer of a family that has a
    window but no layer types (Mistral, Mixtral, Phi-3)."""
    layer_types = getattr(config, "layer_types", None)
    if layer_types is not None:
        return [layer for layer, kind in enumerate(layer_types) if kind == "sliding_attention"]
    if getattr(config, "sliding_window", None) is None:
        return []
    return list(range(config.num_hidden_layers))


def format_layers(layers: list[int]) -> str:
    return ", ".join(str(layer) for layer in layers)


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
