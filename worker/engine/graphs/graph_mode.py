"""Whether decode steps run as CUDA graphs (CUDA_GRAPHS), apart from worker/engine/graphs/cuda_graphs.py, which imports
Triton: a worker without the triton package decides here without loading it."""

from __future__ import annotations

import logging
from enum import Enum

import torch
from transformers import PretrainedConfig

from worker.engine.attention.backend import AttentionBackend

logger = logging.getLogger(__name__)


class GraphMode(str, Enum):
    CAPTURE = "capture"  # captured at warm-up, replayed
    EAGER_REPLAY = "eager_replay"  # the same padded static-buffer steps, run eagerly: the graph path on a CPU


def resolve_graph_mode(name: str, device: torch.device, backend: AttentionBackend) -> GraphMode | None:
    """CUDA_GRAPHS `name` on `device` with `backend`; None: every step eager. Graphs need the Triton kernels,
    whose metadata has fixed shapes (flash-attn's and the SDPA path's do not)."""
    if name == "off":
        return None
    if name not in ("auto", GraphMode.EAGER_REPLAY.value):
        raise ValueError(f"CUDA_GRAPHS {name!r} is not one of auto, off, {GraphMode.EAGER_REPLAY.value}")
    if backend is not AttentionBackend.TRITON:
        if name != "auto":
            raise ValueError(f"CUDA_GRAPHS={name} needs ATTENTION_BACKEND=triton, not {backend.value}")
        if device.type == "cuda":
            logger.info("decode steps run eagerly: CUDA graphs need the triton backend, not %s", backend.value)
        return None
    if name == "auto":
        return GraphMode.CAPTURE if device.type == "cuda" else None
    return GraphMode.EAGER_REPLAY


def has_routed_experts(config: PretrainedConfig) -> bool:
    """Mixture-of-experts layers (Mixtral, Qwen3-MoE, gpt-oss): HF's experts route tokens with a count copied from
    the host each step (`torch._grouped_mm`'s offsets), which a CUDA graph cannot record."""
    text_config = config.get_text_config()
    return any(getattr(text_config, name, None) for name in ("num_experts_per_tok", "num_local_experts", "num_experts"))


def graph_mode_for_model(mode: GraphMode | None, config: PretrainedConfig) -> GraphMode | None:
    """`mode`, unless the model's layers cannot be captured: then every step runs eagerly (seen on an H100 with
    transformers 5.17: capturing a Mixtral step failed copying the experts' offsets from the host)."""
    if mode is GraphMode.CAPTURE and has_routed_experts(config):
        logger.info("decode steps run eagerly: the model's experts copy their routing from the host each step")
        return None
    return mode
