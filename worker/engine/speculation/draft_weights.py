"""The draft model's weights, loaded beside the target's before the KV pools are sized, so that both pools fit."""

from __future__ import annotations

import logging

import torch
from transformers import AutoModelForCausalLM, PretrainedConfig, PreTrainedModel

logger = logging.getLogger(__name__)


def load_draft_weights(
    name: str, target: PretrainedConfig, device: torch.device, dtype: torch.dtype, attention: str, max_model_len: int
) -> PreTrainedModel:
    """Raises ValueError for a draft that cannot propose for the target: a larger vocabulary (its tokens would not
    be the target's) or a shorter context."""
    model = AutoModelForCausalLM.from_pretrained(name, dtype=dtype, attn_implementation=attention)
    model.to(device).eval()
    draft_vocab, target_vocab = model.config.vocab_size, target.vocab_size
    if draft_vocab > target_vocab:
        raise ValueError(f"the draft model's vocabulary ({draft_vocab}) is larger than the target's ({target_vocab})")
    if model.config.max_position_embeddings < max_model_len:
        raise ValueError(
            f"the draft model's context ({model.config.max_position_embeddings}) is shorter than the target's "
            f"max_model_len ({max_model_len})"
        )
    logger.info("draft model %s: %.1fM parameters", name, model.num_parameters() / 1e6)
    return model
