"""Small random-init models of every HF family the engine serves, built on the fly with the tiny tokenizer's vocab.

`family_config(family)` is the HF config, `build_family_model(family)` the float32 model (seeded, eval), and
`write_family_model(family, out)` a model folder the engine loads like any other (weights, config, the tiny
tokenizer's files). Each config keeps the family's own shape (Conv1D and learned positions for gpt2, partial rotary
and a parallel residual for gpt_neox, position offset 2 for opt, soft-caps and alternating windows for gemma2,...)
at a size a CPU test runs in seconds; the windows are small so that test prompts pass them.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import torch
from transformers import AutoConfig, AutoModelForCausalLM, PretrainedConfig, PreTrainedModel

VOCAB_SIZE = 2048  # the tiny tokenizer's (models/tiny)
SPECIAL_TOKENS = {"bos_token_id": 0, "eos_token_id": 4, "pad_token_id": 5}
SLIDING_WINDOW = 16  # tokens; test prompts run several windows long
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")
# Wider than HF's 0.02: the greedy token then leads its runner-up by tenths of a logit rather than thousandths, so a
# comparison with HF cannot flip on summation order, and attention is sharp enough that a wrong window shows.
WEIGHT_STD = 0.2

# The Llama-shaped core most families share: 4 layers, hidden 64, 4 query heads of 16 over 2 KV heads.
LLAMA_SHAPE: dict[str, Any] = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": False,
    "initializer_range": WEIGHT_STD,
}
MOE_SHAPE: dict[str, Any] = {"num_local_experts": 4, "num_experts_per_tok": 2}
ALTERNATING = ["sliding_attention", "full_attention"] * 2

FAMILY_FIELDS: dict[str, dict[str, Any]] = {
    "llama": LLAMA_SHAPE,
    "mistral": {**LLAMA_SHAPE, "sliding_window": SLIDING_WINDOW},
    "mixtral": {**LLAMA_SHAPE, **MOE_SHAPE},
    "qwen3_moe": {**LLAMA_SHAPE, **MOE_SHAPE, "moe_intermediate_size": 32, "norm_topk_prob": True},
    "qwen2": {**LLAMA_SHAPE, "attention_bias": True},
    "qwen3": LLAMA_SHAPE,
    "gemma": {**LLAMA_SHAPE, "tie_word_embeddings": True},
    "gemma2": {
        **LLAMA_SHAPE,
        "tie_word_embeddings": True,
        "sliding_window": SLIDING_WINDOW,
        "layer_types": ALTERNATING,
        "query_pre_attn_scalar": 24,  # not head_dim, so a kernel that scales by head_dim ** -0.5 shows
        "attn_logit_softcapping": 50.0,
        "final_logit_softcapping": 30.0,
    },
    "gemma3_text": {
        **LLAMA_SHAPE,
        "num_hidden_layers": 6,  # HF's own pattern: five sliding layers, then a full one
        "tie_word_embeddings": True,
        "sliding_window": SLIDING_WINDOW,
        "query_pre_attn_scalar": 24,
    },
    "gpt_oss": {
        **LLAMA_SHAPE,
        **MOE_SHAPE,
        "sliding_window": SLIDING_WINDOW,
        "layer_types": ALTERNATING,
    },
    "phi3": {**LLAMA_SHAPE, "pad_token_id": SPECIAL_TOKENS["pad_token_id"]},
    "olmo2": LLAMA_SHAPE,
    "granite": {
        **LLAMA_SHAPE,  # Granite 3's multipliers, so that each one shows if it is dropped
        "embedding_multiplier": 12.0,
        "residual_multiplier": 0.22,
        "attention_multiplier": 0.0625,
        "logits_scaling": 8.0,
    },
    "gpt2": {"n_embd": 64, "n_layer": 4, "n_head": 4, "n_positions": 1024, "initializer_range": WEIGHT_STD},
    "gpt_neox": {
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "max_position_embeddings": 4096,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
        "use_parallel_residual": True,
        "initializer_range": WEIGHT_STD,
    },
    "opt": {
        "hidden_size": 64,
        "ffn_dim": 128,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "word_embed_proj_dim": 64,
        "max_position_embeddings": 2048,
        "init_std": WEIGHT_STD,
    },
}
FAMILIES: tuple[str, ...] = tuple(FAMILY_FIELDS)
# The families whose layers are Llama's with another name (no window, no soft-cap, no learned positions).
LLAMA_SHAPED_FAMILIES = ("llama", "qwen2", "qwen3", "phi3", "olmo2", "granite")


def family_config(family: str, **overrides: Any) -> PretrainedConfig:
    """The family's small HF config; `overrides` replace or add config fields (e.g. sliding_window=32)."""
    fields = {**FAMILY_FIELDS[family], **SPECIAL_TOKENS, "vocab_size": VOCAB_SIZE, **overrides}
    return AutoConfig.for_model(family, **fields)


def build_family_model(family: str, seed: int = 0, **overrides: Any) -> PreTrainedModel:
    """The family's model in float32 with weights drawn from `seed`, in eval mode."""
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(family_config(family, **overrides), dtype=torch.float32)
    return model.eval()


def write_family_model(
    family: str, out: Path, tokenizer_dir: Path, seed: int = 0, **overrides: Any
) -> tuple[Path, PreTrainedModel]:
    """Saves the family's model to `out` with the tiny tokenizer's files from `tokenizer_dir`; returns the folder
    and the model it holds (the same weights, for HF's reference run)."""
    model = build_family_model(family, seed, **overrides)
    model.generation_config.eos_token_id = SPECIAL_TOKENS["eos_token_id"]
    model.generation_config.pad_token_id = SPECIAL_TOKENS["pad_token_id"]
    model.save_pretrained(out)
    for name in TOKENIZER_FILES:
        if (tokenizer_dir / name).exists():
            shutil.copy(tokenizer_dir / name, out / name)
    return out, model
