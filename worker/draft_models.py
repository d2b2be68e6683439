"""The model-based proposers a worker offers: "self" (the target's first layers, always, where the architecture
allows) and "draft" (a smaller model with the same tokenizer, when SPECULATIVE_DRAFT_MODEL names one)."""

from __future__ import annotations

import copy
import logging

from torch import nn
from transformers import AutoModelForCausalLM, PreTrainedModel

from tasks.config import Config
from worker.draft_proposer import DraftModel, DraftProposer
from worker.kv_pool import KVPool, KVShape
from worker.model_runner import ModelRunner

logger = logging.getLogger(__name__)


def load_proposers(config: Config, runner: ModelRunner) -> dict[str, DraftProposer]:
    """Raises ValueError when the worker's default method needs a proposer that cannot be built."""
    proposers = {}
    try:
        proposers["self"] = DraftProposer(self_draft(runner, config.spec_self_draft_layers), config.prefill_chunk_size)
    except ValueError as exc:
        if config.speculative_method == "self":
            raise
        logger.warning("no self-draft speculation: %s", exc)
    if config.speculative_draft_model:
        draft = load_draft_model(config.speculative_draft_model, runner)
        proposers["draft"] = DraftProposer(draft, config.prefill_chunk_size)
    elif config.speculative_method == "draft":
        raise ValueError("SPECULATIVE_METHOD=draft needs SPECULATIVE_DRAFT_MODEL")
    return proposers


def self_draft(runner: ModelRunner, num_layers: int) -> DraftModel:
    """The target's first `num_layers` decoder layers (0: half of them), its final norm and LM head, sharing the
    target's weights and its KV pool: those layers' K/V of every computed token are already there."""
    num_target_layers = runner.model.config.num_hidden_layers
    num_layers = num_layers or max(1, num_target_layers // 2)
    if not 1 <= num_layers < num_target_layers:
        raise ValueError(f"a self-draft needs 1 to {num_target_layers - 1} layers, got {num_layers}")
    model = truncated_model(runner.model, num_layers)
    logger.info("self-draft speculation: the first %d of %d layers", num_layers, num_target_layers)
    return DraftModel(model, runner.kv_pool, runner.device, runner.is_flash, shares_target_pool=True)


def truncated_model(model: PreTrainedModel, num_layers: int) -> PreTrainedModel:
    """A view of `model` whose decoder runs only its first `num_layers` layers; nothing is copied but module
    containers. Needs the usual layout: the decoder (at `base_model_prefix`) keeps its layers in `layers`."""
    decoder = getattr(model, model.base_model_prefix, None)
    layers = getattr(decoder, "layers", None)
    if not isinstance(layers, nn.ModuleList):
        raise ValueError(f"{type(model).__name__} keeps no decoder layers where a self-draft can find them")
    truncated_decoder = _with_own_children(decoder)
    truncated_decoder.layers = layers[:num_layers]
    truncated = _with_own_children(model)
    setattr(truncated, model.base_model_prefix, truncated_decoder)
    return truncated


def _with_own_children(module: nn.Module) -> nn.Module:
    """A shallow copy whose child modules can be replaced without touching the original's."""
    clone = copy.copy(module)
    clone._modules = dict(module._modules)
    return clone


def load_draft_model(name: str, runner: ModelRunner) -> DraftModel:
    """The draft model on the target's device and dtype, with a pool of the target's blocks (same ids and size), so
    a request's block table addresses its draft K/V too."""
    model = AutoModelForCausalLM.from_pretrained(name, dtype=runner.dtype, attn_implementation=runner.attention_backend)
    model.to(runner.device).eval()
    draft_vocab, target_vocab = model.config.vocab_size, runner.model.config.vocab_size
    if draft_vocab > target_vocab:
        raise ValueError(f"the draft model's vocabulary ({draft_vocab}) is larger than the target's ({target_vocab})")
    if model.config.max_position_embeddings < runner.max_model_len:
        raise ValueError(
            f"the draft model's context ({model.config.max_position_embeddings}) is shorter than the target's "
            f"max_model_len ({runner.max_model_len})"
        )
    target_pool = runner.kv_pool
    pool = KVPool(
        KVShape.of(model.config),
        target_pool.num_blocks,
        target_pool.block_size,
        runner.dtype,
        runner.device,
        is_heads_major=target_pool.is_heads_major,
    )
    logger.info(
        "draft model %s: %.1fM parameters, KV pool %.1f MiB", name, model.num_parameters() / 1e6, pool.num_bytes / 2**20
    )
    return DraftModel(model, pool, runner.device, runner.is_flash, shares_target_pool=False)
