"""Which sliding window each layer of a config gets, and which attention variants our kernels do not implement."""

from __future__ import annotations

import pytest
from transformers import AutoConfig

from tests.worker.family_configs import FAMILIES, SLIDING_WINDOW, family_config
from worker.engine.attention.backend import AttentionBackend
from worker.engine.attention.layer_attention import layer_windows, unsupported_attention_variants

W = SLIDING_WINDOW


@pytest.mark.parametrize(
    ("family", "overrides", "expected"),
    [
        ("llama", {}, (None,) * 4),
        ("phi3", {"sliding_window": W}, (W,) * 4),  # Phi-3's own configs slide (2,047 tokens in the 4k models)
        ("mistral", {}, (W,) * 4),  # every layer, no layer types
        ("mixtral", {}, (None,) * 4),  # no window unless the config sets one
        ("qwen3_moe", {"sliding_window": W}, (None,) * 4),  # HF drops it without use_sliding_window
        ("qwen3_moe", {"sliding_window": W, "use_sliding_window": True}, (W,) * 4),
        ("gemma2", {}, (W, None, W, None)),
        ("gemma3_text", {}, (W, W, W, W, W, None)),  # HF's own pattern
        ("gpt_oss", {}, (W, None, W, None)),
    ],
)
def test_layer_windows_are_hfs(family: str, overrides: dict[str, object], expected: tuple[int | None, ...]) -> None:
    assert layer_windows(family_config(family, **overrides)) == expected


@pytest.mark.parametrize("family", FAMILIES)
def test_every_family_the_engine_serves_is_implemented_on_the_cpu_backends(family: str) -> None:
    for backend in (AttentionBackend.CPU_KERNEL, AttentionBackend.SDPA, AttentionBackend.TRITON):
        assert unsupported_attention_variants(family_config(family), backend) == []


def test_sinks_are_refused_on_flash_attn_and_windows_and_soft_caps_are_not() -> None:
    assert unsupported_attention_variants(family_config("gpt_oss"), AttentionBackend.FLASH_ATTN) == [
        "attention sinks (s_aux) on the flash_attn backend"
    ]
    assert unsupported_attention_variants(family_config("gemma2"), AttentionBackend.FLASH_ATTN) == []


@pytest.mark.parametrize(
    ("model_type", "fields", "named"),
    [
        ("gemma3_text", {"use_bidirectional_attention": True}, "bidirectional attention"),
        ("llama4_text", {"attention_chunk_size": 8192}, "chunked attention (attention_chunk_size)"),
        (
            "llama",
            {"layer_types": ["full_attention", "chunked_attention"], "num_hidden_layers": 2},
            "'chunked_attention'",
        ),
        ("t5", {}, "encoder-decoder attention"),
        ("llama", {"sliding_window": 4096}, "a sliding window in a llama config"),
        ("gpt2", {"layer_types": ["sliding_attention"] * 2, "sliding_window": 64, "n_layer": 2}, "in a gpt2 config"),
        ("falcon", {"alibi": True}, "ALiBi position biases"),
    ],
)
def test_variants_the_kernels_lack_are_named(model_type: str, fields: dict[str, object], named: str) -> None:
    missing = unsupported_attention_variants(AutoConfig.for_model(model_type, **fields))
    assert any(named in variant for variant in missing), missing
