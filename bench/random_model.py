"""Random-init models of realistic sizes, built from a config and saved once, so that benchmarks measure arithmetic
rather than the tiny model's per-operator overhead: a size preset in one of FAMILIES' architectures (Llama by
default; Qwen3 adds q/k norms to the same shapes). Nothing is downloaded: prompts are random token ids, so no
tokenizer is needed; the vocabulary and special token ids come from the tiny model's config when the preset asks for
it.

    from bench.random_model import random_model_dir
    path = random_model_dir("135m", torch.float32)  # var/random-models/135m-float32-seed0, built on first use
    path = random_model_dir("135m", torch.float32, family="qwen3")  # var/random-models/qwen3-135m-float32-seed0
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM, PretrainedConfig

from tasks.config import REPO_ROOT

logger = logging.getLogger(__name__)

CACHE_ROOT = REPO_ROOT / "var" / "random-models"
TINY_MODEL = REPO_ROOT / "models" / "tiny"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")
DONE_MARKER = ".complete"


@dataclass(frozen=True)
class ModelSize:
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    vocab_size: int | None  # None: the tiny model's vocabulary and special tokens (its tokenizer fits)


SIZES = {
    # a few seconds on a CPU under Triton's interpreter: the GPU bench's smoke test
    "tiny": ModelSize(64, 2, 4, 2, 128, vocab_size=None),
    # SmolLM-135M's shape with the tiny tokenizer's 2,048 tokens: 107M parameters, almost all in the decoder layers
    "135m": ModelSize(576, 30, 9, 3, 1536, vocab_size=None),
    # Llama-3.2-1B's shape (tied 128,256-token embeddings: 1.24B parameters)
    "1b": ModelSize(2048, 16, 32, 8, 8192, vocab_size=128256),
}
LLAMA3_SPECIALS = {"bos_token_id": 128000, "eos_token_id": 128001, "pad_token_id": None}
FAMILIES = ("llama", "qwen3")  # HF model types whose configs take the size's fields under these names


def model_config(size: ModelSize, family: str = "llama") -> PretrainedConfig:
    """A config of `family` at `size`, with tied embeddings and a 4,096-token context."""
    if size.vocab_size is None:
        tiny = json.loads((TINY_MODEL / "config.json").read_text())
        vocab = {key: tiny[key] for key in ("vocab_size", "bos_token_id", "eos_token_id", "pad_token_id")}
    else:
        vocab = {"vocab_size": size.vocab_size, **LLAMA3_SPECIALS}
    return AutoConfig.for_model(
        family,
        hidden_size=size.hidden_size,
        num_hidden_layers=size.num_layers,
        num_attention_heads=size.num_heads,
        num_key_value_heads=size.num_kv_heads,
        head_dim=size.hidden_size // size.num_heads,
        intermediate_size=size.intermediate_size,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        rms_norm_eps=1e-5,
        **vocab,
    )


def random_model_dir(
    name: str, dtype: torch.dtype, seed: int = 0, root: Path = CACHE_ROOT, family: str = "llama"
) -> Path:
    """The folder of preset `name`'s random-init `family` model in `dtype`, built (on the GPU when there is one) and
    saved the first time; loads with AutoModelForCausalLM like any other."""
    if name not in SIZES:
        raise ValueError(f"unknown model size {name!r}; choose from {sorted(SIZES)}")
    if family not in FAMILIES:
        raise ValueError(f"unknown model family {family!r}; choose from {list(FAMILIES)}")
    prefix = "" if family == "llama" else f"{family}-"  # Llama's folders keep the names they were built under
    out = root / f"{prefix}{name}-{str(dtype).removeprefix('torch.')}-seed{seed}"
    if (out / DONE_MARKER).exists():
        _add_tiny_tokenizer(SIZES[name], out)
        return out
    started = time.perf_counter()
    config = model_config(SIZES[name], family)
    torch.manual_seed(seed)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config).to(dtype)
    model.save_pretrained(out)
    _add_tiny_tokenizer(SIZES[name], out)
    (out / DONE_MARKER).touch()
    logger.info(
        "built random %s %s (%.1fM parameters, %s) at %s in %.1fs",
        family,
        name,
        model.num_parameters() / 1e6,
        dtype,
        out,
        time.perf_counter() - started,
    )
    return out


def _add_tiny_tokenizer(size: ModelSize, out: Path) -> None:
    """A preset on the tiny vocabulary gets the tiny tokenizer beside its weights, so that what needs text as well as
    token ids (a grammar compiled against the vocabulary, a chat template) loads the folder like any other model."""
    if size.vocab_size is not None:
        return
    for name in TOKENIZER_FILES:
        if (TINY_MODEL / name).exists() and not (out / name).exists():
            shutil.copyfile(TINY_MODEL / name, out / name)
