"""How the CPU decode kernel (paged_decode.c) reads and writes a quantized pool's layer: paged_decode.c's
`struct kv_codes` (the kind of codes, the layer's K and V scales and their strides) and the scratch its
dequantized blocks take."""

from __future__ import annotations

import ctypes

import torch

from worker.kernels.kv_quant import KVCacheDtype, fp8_e4m3_table

_POINTER, _INT = ctypes.c_void_p, ctypes.c_int64


class _KVCodes(ctypes.Structure):
    """paged_decode.c's struct kv_codes."""

    _fields_ = [
        ("kind", _INT),
        ("table", _POINTER),
        ("k_scales", _POINTER),
        ("v_scales", _POINTER),
        ("scale_head_stride", _INT),
        ("scale_token_stride", _INT),
    ]


class KernelCodes:
    """How the kernel reads and writes one layer of a quantized pool: the codes' kind and the layer's K and V scales
    ([Hkv, slots] float32, strides 0 where one scale serves the layer), held alive while the C code points at them."""

    def __init__(self, kind: KVCacheDtype, k_scales: torch.Tensor, v_scales: torch.Tensor) -> None:
        if k_scales.dtype != torch.float32 or k_scales.stride() != v_scales.stride() or k_scales.device.type != "cpu":
            raise ValueError("the CPU decode kernel needs float32 CPU scales, K's and V's alike")
        self._tensors = (fp8_e4m3_table(), k_scales, v_scales)
        head_stride, token_stride = k_scales.stride()
        self.struct = _KVCodes(
            kind.code, self._tensors[0].data_ptr(), k_scales.data_ptr(), v_scales.data_ptr(), head_stride, token_stride
        )
        self.pointer = ctypes.addressof(self.struct)


def codes_scratch_floats(max_len: int, block_size: int, head_dim: int) -> int:
    """The floats paged_decode.c's attend_codes needs past the caller's scratch: keys and values of a row's blocks
    (at most max_len / block_size + 1 of them) and as many int64 block numbers, aligned."""
    num_blocks = max_len // block_size + 1
    return num_blocks * (2 * block_size * head_dim + 2) + 2
