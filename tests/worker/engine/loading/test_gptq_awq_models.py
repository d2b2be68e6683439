"""GPTQ and AWQ checkpoints made here with GPTQModel's own quantize path (calibrated on random token ids), saved, and
served by the engine through transformers' quantizers: greedy output equals HF `generate` on the same quantized
model. Needs the `gptq` extra (gptqmodel and optimum); without it the worker refuses these formats at start, which
tests/worker/engine/loading/test_quantization.py checks."""

from __future__ import annotations

import dataclasses
import random
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from tasks.config import Config
from tests.worker.engine.loading.test_quantized_models import (
    MAX_TOKENS,
    PROMPTS,
    quantized_reference,
    served_greedy,
)
from tests.worker.engine_harness import hf_greedy

gptqmodel = pytest.importorskip("gptqmodel", reason="the gptq extra (gptqmodel) is not installed")
pytest.importorskip("optimum", reason="the gptq extra (optimum) is not installed")

CALIBRATION_ROWS, CALIBRATION_TOKENS = 16, 48
TINY_VOCAB = 2048  # calibration rows are random token ids below it, past the special tokens
GROUP_SIZE = 32  # divides every input width: the tiny model's 128 and 352, and 384 widened


@dataclass(frozen=True)
class Format:
    quant_method: str  # GPTQModel's, and the checkpoint's quant_method
    checkpoint_format: str  # GPTQModel's format: the packing transformers' quantizer reads
    dtype: str  # quantized, saved and served in: GPTQModel's AWQ packer takes float16 or bfloat16 only
    served_as: str  # the engine's name of the loaded quantization


FORMATS = {
    "gptq": Format("gptq", "gptq", "float32", "gptq:4bit-g32"),
    "awq": Format("awq", "gemm", "bfloat16", "awq:4bit-g32"),
}
# GPTQModel's AWQ clip search takes output channels in batches of 64, and the tiny model's MLP has 352
AWQ_INTERMEDIATE_SIZE = 384


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


def gptqmodel_checkpoint(model_dir: Path, method: str, out: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """`model_dir` quantized to 4 bits by GPTQModel's own quantize with `method`, saved at `out`."""
    # GPTQModel sizes its CPU thread pools at half the cores, and its model loader asks for 2 workers: on a 2-core
    # machine the default (1) is refused, so ask for 2 before its pools are first built
    monkeypatch.setenv("GPTQMODEL_CPU_WORKERS", "2")
    spec = FORMATS[method]
    rng = random.Random(0)
    calibration = [
        {
            "input_ids": [rng.randrange(5, TINY_VOCAB) for _ in range(CALIBRATION_TOKENS)],
            "attention_mask": [1] * CALIBRATION_TOKENS,
        }
        for _ in range(CALIBRATION_ROWS)
    ]
    quantize_config = gptqmodel.QuantizeConfig(
        bits=4,
        group_size=GROUP_SIZE,
        quant_method=spec.quant_method,
        format=spec.checkpoint_format,
    )
    # the checkpoint keeps the dtype it was quantized in (GPTQModel's CPU default is bfloat16)
    dtype = getattr(torch, spec.dtype)
    with monkeypatch.context() as during_quantize:
        during_quantize.chdir(out.parent)  # GPTQModel writes its quantization logs under ./logs
        model = gptqmodel.GPTQModel.load(str(model_dir.resolve()), quantize_config, device="cpu", dtype=dtype)
        # its portable torch packer: the default for AWQ's GEMM format packs with a CUDA kernel; the saved checkpoint
        # is the same format either way
        model.quantize(calibration, batch_size=4, backend=gptqmodel.BACKEND.TORCH)
        model.save(str(out.resolve()))
    return out


@pytest.mark.parametrize("method", list(FORMATS))
def test_a_gptqmodel_checkpoint_serves_what_hf_generates_with_it(
    method: str, tiny_config: Config, tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    model_dir = Path(tiny_config.model)
    if method == "awq":
        model_dir = widened_mlp_checkpoint(model_dir, AWQ_INTERMEDIATE_SIZE, tmp_path / "widened")
    checkpoint = gptqmodel_checkpoint(model_dir, method, tmp_path / method, monkeypatch)
    reference = quantized_reference(checkpoint)
    expected = [hf_greedy(reference, frozenset(), prompt, MAX_TOKENS) for prompt in PROMPTS]
    config = dataclasses.replace(tiny_config, model=str(checkpoint), dtype=FORMATS[method].dtype)
    name, tokens = served_greedy(config, caplog)
    assert name == FORMATS[method].served_as
    assert tokens == expected
