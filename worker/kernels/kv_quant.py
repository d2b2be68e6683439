"""How a quantized KV pool stores each token's K and V: KV_CACHE_DTYPE's element formats, their scales, and the
quantize and dequantize arithmetic every attention backend shares.

- `int8`: symmetric, one float32 scale per token per KV head, for K and for V apart (the token's amax over the head
  dimension / 127), so a token's codes never change once written and a rolled-back or recomputed slot needs no
  rescaling of its block.
- `fp8_e4m3`: float8 e4m3fn codes stored as bytes, one float32 scale per layer for K and one for V, as vLLM keeps
  them. The scale is fixed at 1.0 (vLLM's default without calibrated scales): values saturate at +-448, which no K/V
  of the models we serve reaches, and e4m3 keeps 3 mantissa bits down to 2**-6.

Codes are converted exactly by torch (`float8_e4m3fn`, rounding to nearest even and saturating), by the C kernel
(worker/kernels/paged_decode.c, through a 256-entry table of torch's values) and by the Triton kernels (bit fields).
"""

from __future__ import annotations

from enum import Enum

import torch

INT8_MAX = 127.0
FP8_E4M3_MAX = 448.0
MIN_INT8_SCALE = 1e-8  # the scale of an all-zero head: its codes are 0 whatever the scale
FP8_DEFAULT_SCALE = 1.0


class KVCacheDtype(str, Enum):
    AUTO = "auto"  # the model's dtype: no quantization
    INT8 = "int8"
    FP8_E4M3 = "fp8_e4m3"

    @property
    def is_quantized(self) -> bool:
        return self is not KVCacheDtype.AUTO

    @property
    def code(self) -> int:
        """How the C and Triton kernels name it: 0 float, 1 int8, 2 fp8 e4m3."""
        return (KVCacheDtype.AUTO, KVCacheDtype.INT8, KVCacheDtype.FP8_E4M3).index(self)

    def storage_dtype(self, model_dtype: torch.dtype) -> torch.dtype:
        """The pool's element: int8 codes, fp8 codes as uint8 bytes (index_copy_ has no float8 kernel on CPU), or
        the model's dtype."""
        return {KVCacheDtype.INT8: torch.int8, KVCacheDtype.FP8_E4M3: torch.uint8}.get(self, model_dtype)

    def scale_bytes_per_head(self) -> int:
        """Scale bytes each token adds per KV head, for K or V: int8 keeps one float32; fp8's are per layer."""
        return 4 if self is KVCacheDtype.INT8 else 0


def resolve_kv_cache_dtype(name: str) -> KVCacheDtype:
    try:
        return KVCacheDtype(name)
    except ValueError:
        choices = ", ".join(kind.value for kind in KVCacheDtype)
        raise ValueError(f"KV_CACHE_DTYPE {name!r} is not one of {choices}") from None


def quantize_int8(values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`values` [..., D] as int8 codes [..., D] and their scales [...] float32: code = round(x / scale), halves to
    even, with scale = amax over D / 127."""
    values = values.float()
    scales = values.abs().amax(dim=-1).clamp(min=MIN_INT8_SCALE * INT8_MAX) / INT8_MAX
    codes = torch.round(values / scales[..., None]).clamp(-INT8_MAX, INT8_MAX).to(torch.int8)
    return codes, scales


def quantize_fp8(values: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """`values` [..., D] / `scale` (one float32) as float8 e4m3fn codes in uint8, saturated at +-448."""
    scaled = (values.float() / scale).clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX)
    return scaled.to(torch.float8_e4m3fn).view(torch.uint8)


def dequantize(codes: torch.Tensor, scales: torch.Tensor, kind: KVCacheDtype, dtype: torch.dtype) -> torch.Tensor:
    """Codes [..., D] times their scales (broadcast over D: [...] per token, or one per layer), in `dtype`."""
    values = codes.view(torch.float8_e4m3fn).float() if kind is KVCacheDtype.FP8_E4M3 else codes.float()
    return (values * scales[..., None]).to(dtype)


def fp8_e4m3_table() -> torch.Tensor:
    """[256] float32: the value of every e4m3fn byte as torch converts it (0x7f and 0xff are NaN, never written)."""
    return torch.arange(256, dtype=torch.int32).to(torch.uint8).view(torch.float8_e4m3fn).float()
