"""How an input's hidden states become one vector: the model directory's sentence-transformers pooling config when
it has one (`modules.json` naming a `Pooling` module), else the last token's, which is what a causal LM's last
position has read of the whole input."""

from __future__ import annotations

import json
from enum import Enum
from pathlib import Path

import torch
import torch.nn.functional as F

POOLING_MODULE = "sentence_transformers.models.Pooling"
# sentence-transformers' config keys, in the order it checks them; max and weighted-mean pooling are refused
MODE_KEYS = {"pooling_mode_cls_token": "first", "pooling_mode_mean_tokens": "mean", "pooling_mode_lasttoken": "last"}


class Pooling(str, Enum):
    FIRST = "first"  # sentence-transformers' "cls" mode: the input's first token
    MEAN = "mean"
    LAST = "last"


def read_pooling(model_dir: str) -> Pooling:
    """The pooling `model_dir` declares; LAST when it declares none; ValueError naming a mode we do not compute."""
    modules_file = Path(model_dir) / "modules.json"
    if not modules_file.is_file():
        return Pooling.LAST
    modules = json.loads(modules_file.read_text())
    pooling = next((module for module in modules if module.get("type") == POOLING_MODULE), None)
    if pooling is None:
        return Pooling.LAST
    settings = json.loads((Path(model_dir) / pooling.get("path", "") / "config.json").read_text())
    chosen = [mode for key, mode in MODE_KEYS.items() if settings.get(key)]
    others = sorted(key for key, value in settings.items() if key.startswith("pooling_mode_") and value)
    if len(chosen) != 1 or len(others) != 1:
        raise ValueError(
            f"the model's pooling config sets {others or 'no mode'}; embeddings support exactly one of "
            f"{', '.join(MODE_KEYS)}"
        )
    return Pooling(chosen[0])


def pool(hidden: torch.Tensor, lengths: list[int], pooling: Pooling) -> torch.Tensor:
    """[B, D] float32: one vector per input, from the packed hidden states [N, D] of inputs of `lengths` tokens."""
    ends = torch.tensor(lengths, device=hidden.device).cumsum(0)
    if pooling is Pooling.LAST:
        return hidden[ends - 1].float()
    if pooling is Pooling.FIRST:
        return hidden[ends - ends.new_tensor(lengths)].float()
    rows = torch.repeat_interleave(torch.arange(len(lengths), device=hidden.device), ends.new_tensor(lengths))
    sums = torch.zeros(len(lengths), hidden.shape[1], dtype=torch.float32, device=hidden.device)
    sums.index_add_(0, rows, hidden.float())
    return sums / ends.new_tensor(lengths).unsqueeze(1)


def normalized(vectors: torch.Tensor, dimensions: int | None) -> torch.Tensor:
    """[B, dimensions or D]: the leading `dimensions` components, L2-normalised (OpenAI's shortened embeddings)."""
    return F.normalize(vectors[:, :dimensions], dim=-1)
