"""Loads the HF causal LM once and runs its forward passes (prefill and decode) over a DynamicCache."""

from __future__ import annotations

import logging
import time

import torch
from transformers import AutoModelForCausalLM, DynamicCache, PreTrainedModel

from tasks.config import Config

logger = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if name not in DTYPES:
        raise ValueError(f"dtype {name!r} is not one of auto, {', '.join(DTYPES)}")
    return DTYPES[name]


def read_eos_token_ids(model: PreTrainedModel) -> frozenset[int]:
    ids: set[int] = set()
    for source in (model.generation_config, model.config):
        value = getattr(source, "eos_token_id", None)
        if isinstance(value, int):
            ids.add(value)
        elif value is not None:
            ids.update(int(token_id) for token_id in value)
    return frozenset(ids)


class ModelRunner:
    """Owns the model on one device; every method must be called from the engine thread."""

    def __init__(self, config: Config) -> None:
        self.device = resolve_device(config.device)
        self.dtype = resolve_dtype(config.dtype, self.device)
        started = time.perf_counter()
        self.model = AutoModelForCausalLM.from_pretrained(config.model, dtype=self.dtype).to(self.device).eval()
        self.eos_token_ids = read_eos_token_ids(self.model)
        self.max_model_len = config.max_model_len or int(self.model.config.max_position_embeddings)
        logger.info(
            "loaded %s on %s as %s: %.1fM parameters in %.1fs, max_model_len %d, eos %s",
            config.model,
            self.device,
            self.dtype,
            self.model.num_parameters() / 1e6,
            time.perf_counter() - started,
            self.max_model_len,
            sorted(self.eos_token_ids),
        )

    def new_cache(self) -> DynamicCache:
        return DynamicCache(config=self.model.config)

    @torch.inference_mode()
    def forward(
        self,
        input_ids: torch.Tensor,  # [B, T]
        attention_mask: torch.Tensor,  # [B, past + T], 0 on left padding
        position_ids: torch.Tensor,  # [B, T]
        cache: DynamicCache,
    ) -> torch.Tensor:
        """Runs the model over the new tokens, appending their K/V to `cache`; returns the last position's logits."""
        output = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
        )
        return output.logits[:, -1, :].float()  # [B, V]
