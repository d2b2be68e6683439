"""Whether decode steps run as CUDA graphs (CUDA_GRAPHS), apart from worker/engine/graphs/cuda_graphs.py, which imports
Triton: a worker without the triton package decides here without loading it."""

from __future__ import annotations

import logging
from enum import Enum

import torch

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
