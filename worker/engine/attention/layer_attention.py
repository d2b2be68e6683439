"""Which attention variants a model's config asks for, and which of them our kernels implement.

HF's modules pass each layer's variant with every call (worker/kernels/layer_variant.py), and every backend applies
it inside its kernels. The step metadata of the gathering SDPA path depends on the window, so it is built per window
ahead of the forward: the windows a model's layers use are read from its config here (`layer_windows`), and each
call checks that HF passed the window read for its layer.
"""

from __future__ import annotations

from transformers import PretrainedConfig

from worker.engine.attention.backend import AttentionBackend

ATTENTION_LAYER_TYPES = frozenset({"full_attention", "sliding_attention"})  # config.layer_types we implement
SINK_MODEL_TYPES = frozenset({"gpt_oss"})  # families whose attention modules pass per-head sinks (s_aux)
# Families whose attention modules pass a sliding window. In the others (Llama, Gemma, OLMo 2, Granite, GPT-2,
# GPT-NeoX, OPT) a window in the config is applied by HF `generate`'s mask but not by the model's own forward.
WINDOWED_MODEL_TYPES = frozenset(
    {"mistral", "mixtral", "qwen3_moe", "qwen2", "qwen3", "phi3", "gemma2", "gemma3_text", "gpt_oss"}
)


def layer_windows(config: PretrainedConfig) -> tuple[int | None, ...]:
    """Per layer, the sliding window HF's mask gives it: the layers `config.layer_types` marks as sliding, where the
    family lists layer types; else every layer slides by `config.sliding_window` (Mistral, Mixtral, Qwen3-MoE), or
    none does."""
    config = config.get_text_config()
    window = getattr(config, "sliding_window", None)
    layer_types = getattr(config, "layer_types", None)
    if layer_types is None:
        return (window,) * config.num_hidden_layers
    return tuple(window if layer_type == "sliding_attention" else None for layer_type in layer_types)


def unsupported_attention_variants(
    config: PretrainedConfig, backend: AttentionBackend | None = None, device_type: str | None = None
) -> list[str]:
    """The attention variants `config` asks for that our kernels do not implement (on `backend` and a `device_type`
    device, when given), each named as an error message can list it; empty when every layer attends as our kernels
    compute."""
    config = config.get_text_config()
    layer_types = set(getattr(config, "layer_types", None) or ()) - ATTENTION_LAYER_TYPES
    missing = [f"attention layer type {kind!r}" for kind in sorted(layer_types)]
    checks = {
        "encoder-decoder attention": getattr(config, "is_encoder_decoder", False),
        "cross-attention": getattr(config, "add_cross_attention", False),
        "bidirectional attention": getattr(config, "use_bidirectional_attention", False)
        or not getattr(config, "is_causal", True),
        "chunked attention (attention_chunk_size)": getattr(config, "attention_chunk_size", None) is not None,
        "ALiBi position biases": getattr(config, "alibi", False)
        or getattr(config, "position_embedding_type", None) == "alibi",
    }
    missing += [name for name, is_asked in checks.items() if is_asked]
    if config.model_type not in WINDOWED_MODEL_TYPES and any(window is not None for window in layer_windows(config)):
        missing.append(
            f"a sliding window in a {config.model_type} config (HF's {config.model_type} attention ignores it, while "
            "HF generate's mask applies it; remove sliding_window from the config to serve full attention)"
        )
    if backend is AttentionBackend.FLASH_ATTN and config.model_type in SINK_MODEL_TYPES:
        missing.append("attention sinks (s_aux) on the flash_attn backend")
    softcap = getattr(config, "attn_logit_softcapping", None)
    if device_type == "cuda" and softcap is not None:
        # Measured on an H100 (transformers 5.17): a soft-capped Gemma 2's prompt logprobs came out up to 2.9 nats off
        # HF's on every CUDA backend, while the same kernels match HF to 1e-5 on CPU. Refused there until found.
        missing.append(f"attention-logit soft-capping on CUDA (attn_logit_softcapping={softcap}; served on CPU)")
    return missing
