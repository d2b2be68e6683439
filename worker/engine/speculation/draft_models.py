"""The model-based proposers a worker offers: "self" (the target's first layers, always, where the architecture
allows) and "draft" (a smaller model with the same tokenizer, when SPECULATIVE_DRAFT_MODEL names one)."""

from __future__ import annotations

import copy
import logging

from torch import nn
from transformers import PreTrainedModel

from steering.model_layout import family_layout
from tasks.config import Config
from worker.engine.model_runner import ModelRunner
from worker.engine.speculation.draft_proposer import DraftModel, DraftProposer

logger = logging.getLogger(__name__)


def load_proposers(config: Config, runner: ModelRunner) -> dict[str, DraftProposer]:
    """Raises ValueError when the worker's default method needs a proposer that cannot be built."""
    proposers = {}
    try:
        proposers["self"] = DraftProposer(self_draft(runner, config), config.prefill_chunk_size)
    except ValueError as exc:
        if config.speculative_method == "self":
            raise
        logger.warning("no self-draft speculation: %s", exc)
    if runner.draft_model is not None:
        proposers["draft"] = DraftProposer(loaded_draft_model(runner), config.prefill_chunk_size)
    elif config.speculative_method == "draft":
        raise ValueError("SPECULATIVE_METHOD=draft needs SPECULATIVE_DRAFT_MODEL")
    return proposers


def self_draft(runner: ModelRunner, config: Config) -> DraftModel:
    """The target's first SPEC_SELF_DRAFT_LAYERS decoder layers, its final norm and LM head, sharing the target's
    weights and its KV pool: those layers' K/V of every computed token are already there."""
    num_target_layers = runner.model.config.num_hidden_layers
    num_layers = config.self_draft_layers(num_target_layers)
    if num_layers is None:
        raise ValueError(f"a self-draft of a {num_target_layers}-layer model needs 1 to {num_target_layers - 1} layers")
    model = truncated_model(runner.model, num_layers)
    logger.info("self-draft speculation: the first %d of %d layers", num_layers, num_target_layers)
    return DraftModel(model, runner.kv_pool, runner.device, runner.attention_backend, shares_target_pool=True)


def truncated_model(model: PreTrainedModel, num_layers: int) -> PreTrainedModel:
    """A view of `model` whose decoder runs only its first `num_layers` layers; nothing is copied but the module
    containers on the way to the layers (wherever the family keeps them: steering/model_layout.py)."""
    *parents, name = family_layout(model.config.model_type).layers.split(".")
    truncated = _with_own_children(model)
    container = truncated
    for parent in parents:
        child = _with_own_children(getattr(container, parent))
        setattr(container, parent, child)
        container = child
    layers = getattr(container, name)
    if not isinstance(layers, nn.ModuleList):
        raise ValueError(f"{type(model).__name__} keeps no decoder layers where a self-draft can find them")
    setattr(container, name, layers[:num_layers])
    return truncated


def _with_own_children(module: nn.Module) -> nn.Module:
    """A shallow copy whose child modules can be replaced without touching the original's."""
    clone = copy.copy(module)
    clone._modules = dict(module._modules)
    return clone


def loaded_draft_model(runner: ModelRunner) -> DraftModel:
    """The draft model the runner loaded, over its own pool of the target's blocks (same ids and size)."""
    if runner.draft_model is None or runner.draft_kv_pool is None:
        raise ValueError("the worker loaded no draft model")
    return DraftModel(
        runner.draft_model, runner.draft_kv_pool, runner.device, runner.attention_backend, shares_target_pool=False
    )
