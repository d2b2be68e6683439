"""GPTQ and AWQ checkpoints made with GPTQModel's own quantize path (the library transformers 5 loads both through),
on CPU with its portable torch packer. Needs the `gptq` extra. Called by scripts/quantize_checkpoint.py."""

from __future__ import annotations

import contextlib
import logging
import os
from dataclasses import dataclass
from pathlib import Path

import torch

logger = logging.getLogger(__name__)

# of every grouped 4-bit format made here (compressed-tensors' too): divides the tiny model's widths (128, 352) and the
# 135M model's (576, 1,536)
GROUP_SIZE = 32


@dataclass(frozen=True)
class GPTQModelFormat:
    quant_method: str  # GPTQModel's, and the saved checkpoint's quant_method
    checkpoint_format: str  # the packing transformers' quantizer reads
    dtype: torch.dtype  # GPTQModel's AWQ packer takes float16 or bfloat16 only


GPTQMODEL_FORMATS = {
    "gptq": GPTQModelFormat("gptq", "gptq", torch.float32),
    "awq": GPTQModelFormat("awq", "gemm", torch.bfloat16),
}


def quantize_with_gptqmodel(model_dir: Path, method: str, out_dir: Path, calibration: list[list[int]]) -> None:
    """`model_dir` quantized to 4 bits, groups of GROUP_SIZE, calibrated on the token-id rows of `calibration`, saved
    at `out_dir` in the dtype its format packs (float32 for GPTQ, bfloat16 for AWQ)."""
    # GPTQModel sizes its CPU pools at half the cores and its loader asks for 2 workers: on 2 cores the default of 1
    # is refused. Set before its first import, which builds the pools.
    os.environ.setdefault("GPTQMODEL_CPU_WORKERS", str(max(2, (os.cpu_count() or 2) // 2)))
    import gptqmodel

    spec = GPTQMODEL_FORMATS[method]
    config = gptqmodel.QuantizeConfig(
        bits=4, group_size=GROUP_SIZE, quant_method=spec.quant_method, format=spec.checkpoint_format
    )
    rows = [{"input_ids": row, "attention_mask": [1] * len(row)} for row in calibration]
    model_dir, out_dir = model_dir.resolve(), out_dir.resolve()  # before the chdir below
    out_dir.mkdir(parents=True, exist_ok=True)
    with contextlib.chdir(out_dir):  # GPTQModel writes its quantization logs under ./logs
        model = gptqmodel.GPTQModel.load(str(model_dir), config, device="cpu", dtype=spec.dtype)
        # the torch packer: AWQ's default packs with a CUDA kernel; the saved format is the same either way
        model.quantize(rows, batch_size=4, backend=gptqmodel.BACKEND.TORCH)
        model.save(str(out_dir))
    logger.info("GPTQModel calibrated %s on %d rows", method, len(rows))
