"""The CPU int8 weight-only matmul (int8_weight_matmul.c beside this file), called through ctypes.

torchao's weight-only int8 linear on CPU widens the whole int8 weight to a float copy on every call and multiplies
that: per parameter it reads 1 byte, writes 4 and reads 4 again, where a float32 weight is read once (4 bytes), so
it decodes slower than float32 weights (docs/BENCHMARKS.md). This kernel widens each weight vector in registers as
it multiplies, so a step reads one byte per parameter, with the same float32 products and sums as torchao's
`mm(x, qdata.t().float()) * scale`, in another order.
"""

from __future__ import annotations

import ctypes
import logging
import subprocess
from pathlib import Path

import torch

from worker.kernels.c_library import CFLAGS, built_library

logger = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("int8_weight_matmul.c")
# OpenMP for the threads: the library then shares torch's libgomp, the one already loaded under the same name
FLAGS = (*CFLAGS, "-fopenmp")
_POINTER, _INT = ctypes.c_void_p, ctypes.c_int64


class Int8MatmulKernel:
    def __init__(self, library: Path) -> None:
        self._matmul = ctypes.CDLL(str(library)).int8_weight_matmul  # CDLL releases the GIL during each call
        self._matmul.argtypes = [_POINTER] * 5 + [_INT] * 4
        self._matmul.restype = None

    def __call__(
        self,
        x: torch.Tensor,  # [M, K] float32, contiguous
        weight: torch.Tensor,  # [N, K] int8, contiguous
        scale: torch.Tensor,  # [N] float32, contiguous
        bias: torch.Tensor | None,  # [N] float32, contiguous
    ) -> torch.Tensor:
        """[M, N] float32: `(x @ weight.T) * scale + bias`."""
        # The C code reads and writes through these sizes unchecked: anything else would touch memory it does not own.
        rows, width = x.shape
        num_out = weight.shape[0]
        if weight.shape != (num_out, width) or scale.shape != (num_out,):
            raise ValueError(f"int8 matmul: x {tuple(x.shape)}, weight {tuple(weight.shape)}, scale {scale.shape}")
        if bias is not None and bias.shape != (num_out,):
            raise ValueError(f"int8 matmul: bias {tuple(bias.shape)} for {num_out} outputs")
        for tensor, dtype in ((x, torch.float32), (weight, torch.int8), (scale, torch.float32), (bias, torch.float32)):
            if tensor is not None and (tensor.dtype != dtype or not tensor.is_contiguous() or tensor.is_cuda):
                raise ValueError(f"the int8 matmul kernel needs contiguous {dtype} CPU tensors, got {tensor.dtype}")
        out = torch.empty(rows, num_out, dtype=torch.float32)
        if rows:
            self._matmul(
                x.data_ptr(),
                weight.data_ptr(),
                scale.data_ptr(),
                None if bias is None else bias.data_ptr(),
                out.data_ptr(),
                rows,
                width,
                num_out,
                torch.get_num_threads(),
            )
        return out


def load_int8_matmul_kernel(cache_dir: Path | None = None) -> Int8MatmulKernel | None:
    """The kernel, compiled on first use (see c_library.py); None, with a warning, when it cannot be built."""
    try:
        return Int8MatmulKernel(built_library(SOURCE, FLAGS, cache_dir))
    except (OSError, subprocess.SubprocessError) as exc:
        logger.warning("int8 matmul kernel unavailable (%s): torchao's int8 linears run as torchao runs them", exc)
        return None
