"""GPTQ and AWQ checkpoints made here with GPTQModel's own quantize path (calibrated on random token ids), saved, and
served by the engine through transformers' quantizers: greedy output equals HF `generate` on the same quantized
model. Needs the `gptq` extra (gptqmodel and optimum); without it the worker refuses these formats at start, which
tests/worker/engine/loading/test_quantization.py checks."""

from __future__ import annotations

import dataclasses
import random
import shutil
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from scripts.quantize_checkpoint import quantize_checkpoint
from scripts.quantize_gptqmodel import GPTQMODEL_FORMATS
from tasks.config import Config
from tests.worker.engine.loading.test_quantized_models import (
    MAX_TOKENS,
    PROMPTS,
    quantized_reference,
    served_greedy,
)
from tests.worker.engine_harness import hf_greedy
from tests.worker.greedy_cases import greedy_margins

pytest.importorskip("gptqmodel", reason="the gptq extra (gptqmodel) is not installed")
pytest.importorskip("optimum", reason="the gptq extra (optimum) is not installed")

CALIBRATION_ROWS, CALIBRATION_TOKENS = 16, 48
TINY_VOCAB = 2048  # calibration rows are random token ids below it, past the special tokens
SERVED_AS = {"gptq": "gptq:4bit-g32", "awq": "awq:4bit-g32"}  # the engine's name of the loaded quantization
# GPTQModel's AWQ clip search takes output channels in batches of 64, and the tiny model's MLP has 352
AWQ_INTERMEDIATE_SIZE = 384
# A top-two lead this small is within what float16 arithmetic in another order moves a logit: float16 keeps about
# three decimal digits, the engine's kernels and HF's add in different orders through six layers, and the top logits
# here are about 10 (seen: a lead of 0.0625, eight float16 spacings at 10.25, flipped on an Intel Xeon and not on an
# AMD EPYC)
TIE_MARGIN = 0.125


def widened_mlp_checkpoint(model_dir: Path, intermediate_size: int, out: Path) -> Path:
    """`model_dir`'s model with `intermediate_size` MLP channels: its own, then new ones with random weights of its
    weights' spread (seeded), saved at `out` with its tokenizer files."""
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    generator = torch.Generator().manual_seed(0)
    for layer in model.model.layers:
        mlp = layer.mlp
        extra = intermediate_size - mlp.gate_proj.out_features
        for name, dim in (("gate_proj", 0), ("up_proj", 0), ("down_proj", 1)):
            weight = getattr(mlp, name).weight.detach()
            shape = (extra, weight.shape[1]) if dim == 0 else (weight.shape[0], extra)
            new = torch.randn(shape, generator=generator) * weight.std()
            widened = torch.nn.Linear(1, 1, bias=False)
            widened.weight = torch.nn.Parameter(torch.cat([weight, new], dim=dim))
            setattr(mlp, name, widened)
    model.config.intermediate_size = intermediate_size
    model.save_pretrained(out)
    for path in model_dir.iterdir():
        if path.name.startswith("tokenizer") or path.suffix == ".jinja":
            shutil.copy(path, out / path.name)
    return out


def random_calibration() -> list[list[int]]:
    rng = random.Random(0)
    return [[rng.randrange(5, TINY_VOCAB) for _ in range(CALIBRATION_TOKENS)] for _ in range(CALIBRATION_ROWS)]


@pytest.mark.parametrize("method", list(GPTQMODEL_FORMATS))
def test_a_gptqmodel_checkpoint_serves_what_hf_generates_with_it(
    method: str, tiny_config: Config, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    model_dir = Path(tiny_config.model)
    if method == "awq":
        model_dir = widened_mlp_checkpoint(model_dir, AWQ_INTERMEDIATE_SIZE, tmp_path / "widened")
    checkpoint = quantize_checkpoint(model_dir, method, tmp_path / method, random_calibration())
    reference = quantized_reference(checkpoint)
    expected = [hf_greedy(reference, frozenset(), prompt, MAX_TOKENS) for prompt in PROMPTS]
    dtype = str(GPTQMODEL_FORMATS[method].dtype).removeprefix("torch.")
    config = dataclasses.replace(tiny_config, model=str(checkpoint), dtype=dtype)
    name, tokens = served_greedy(config, caplog)
    assert name == SERVED_AS[method]
    assert_same_but_for_near_ties(reference, tokens, expected)


def assert_same_but_for_near_ties(
    reference: torch.nn.Module, served: list[list[int]], expected: list[list[int]]
) -> None:
    """Each prompt's served tokens are HF's, up to a step whose top two logits are within TIE_MARGIN in the reference
    (where the kernels' float16 summation order may pick either); nothing after that step is compared."""
    for prompt, got, want in zip(PROMPTS, served, expected, strict=True):
        if got == want:
            continue
        step = next(i for i, (a, b) in enumerate(zip(got, want, strict=False)) if a != b)
        tokens, margins = greedy_margins(reference, prompt)  # type: ignore[arg-type]
        assert tokens[: step + 1] == want[: step + 1]
        lead = margins[step]
        assert lead < TIE_MARGIN, f"{prompt}: token {step} differs where HF's top logit leads by {lead}"
