"""Where each HF family keeps the modules an SAE hook point reads: decoder layers, attention and its output
projection, the MLP, and the norms around them.

The hook points follow SAELens (TransformerLens names): a layer's `hook_attn_out` and `hook_mlp_out` are what the
layer adds to the residual stream after attention and after the MLP (after Gemma 2/3's and OLMo 2's post-norms,
before Granite's residual multiplier, which the layer applies itself); `hook_resid_mid` is the residual between the
two, which a parallel-residual layer (GPT-NeoX) and a post-norm OPT layer do not have; `attn.hook_z` is the heads'
outputs as the output projection reads them, [.., n_heads * d_head].
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import reduce

from torch import nn


@dataclass(frozen=True)
class FamilyLayout:
    """Module paths of one family: `layers` from the causal LM, the rest from one decoder layer."""

    layers: str
    attention_projection: str = "self_attn.o_proj"  # its input is attn.hook_z
    attention_out: str = "self_attn"  # its output is hook_attn_out: what the residual adds after attention
    mlp_out: str = "mlp"  # its output is hook_mlp_out
    mlp_input: str | None = "post_attention_layernorm"  # its input is hook_resid_mid; None: the family has none


LLAMA_LAYOUT = FamilyLayout("model.layers")
POST_NORM_LAYOUT = FamilyLayout(  # Gemma 2 and 3: a norm before and after both attention and MLP
    "model.layers",
    attention_out="post_attention_layernorm",
    mlp_out="post_feedforward_layernorm",
    mlp_input="pre_feedforward_layernorm",
)
FAMILY_LAYOUTS: dict[str, FamilyLayout] = {
    **dict.fromkeys(
        ("llama", "mistral", "mixtral", "qwen2", "qwen3", "qwen3_moe", "gemma", "gpt_oss", "phi3", "granite"),
        LLAMA_LAYOUT,
    ),
    "gemma2": POST_NORM_LAYOUT,
    "gemma3_text": POST_NORM_LAYOUT,
    "olmo2": FamilyLayout(  # norms after attention and MLP only: the MLP reads the residual itself
        "model.layers", attention_out="post_attention_layernorm", mlp_out="post_feedforward_layernorm", mlp_input="mlp"
    ),
    "gpt2": FamilyLayout("transformer.h", "attn.c_proj", attention_out="attn", mlp_input="ln_2"),
    "gpt_neox": FamilyLayout("gpt_neox.layers", "attention.dense", attention_out="attention"),
    "opt": FamilyLayout(
        "model.decoder.layers", attention_projection="self_attn.out_proj", mlp_out="fc2", mlp_input="final_layer_norm"
    ),
}


def family_layout(model_type: str) -> FamilyLayout:
    if model_type not in FAMILY_LAYOUTS:
        raise ValueError(
            f"model_type {model_type!r} is not a family the engine knows (one of {', '.join(sorted(FAMILY_LAYOUTS))})"
        )
    return FAMILY_LAYOUTS[model_type]


@dataclass(frozen=True)
class ModelLayout:
    """One loaded model's decoder layers and the hook modules in each."""

    layers: nn.ModuleList
    family: FamilyLayout
    hidden_size: int  # the residual stream's width
    has_resid_mid: bool
    residual_multiplier: float  # Granite scales each sublayer's output by it before the residual adds it

    @classmethod
    def of(cls, model: nn.Module) -> ModelLayout:
        config = model.config
        family = family_layout(config.model_type)
        layers = submodule(model, family.layers)
        if not isinstance(layers, nn.ModuleList):
            raise ValueError(f"{type(model).__name__} keeps no decoder layers at {family.layers}")
        is_parallel = bool(getattr(config, "use_parallel_residual", False))  # GPT-NeoX: attention and MLP side by side
        is_post_norm = not getattr(config, "do_layer_norm_before", True)  # OPT-350m normalizes the residual itself
        has_resid_mid = family.mlp_input is not None and not (is_parallel or is_post_norm)
        multiplier = float(getattr(config, "residual_multiplier", 1.0))
        return cls(layers, family, int(config.get_text_config().hidden_size), has_resid_mid, multiplier)

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    def module(self, layer: int, path: str) -> nn.Module:
        return submodule(self.layers[layer], path)

    def heads_width(self) -> int:
        """n_heads * d_head: the width the attention output projection reads (attn.hook_z)."""
        projection = self.module(0, self.family.attention_projection)
        return int(getattr(projection, "in_features", None) or projection.nx)  # nn.Linear, or GPT-2's Conv1D


def submodule(root: nn.Module, path: str) -> nn.Module:
    return reduce(getattr, path.split("."), root)
