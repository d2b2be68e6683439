"""Which attention kernels a worker runs (ATTENTION_BACKEND), and which it picks by itself (`auto`).

- `sdpa`: decode rows gathered into batched matmuls, prefill chunks through SDPA; runs anywhere.
- `cpu_kernel`: decode rows through the C kernel (worker/kernels/paged_decode.c), prefill through SDPA; CPU, float32.
- `triton`: decode and prefill through the Triton kernels (worker/kernels/triton_*.py) over the blocks in place.
  On CPU only under Triton's interpreter (TRITON_INTERPRET=1), which is for tests: it runs a program at a time.
- `flash_attn`: flash-attn's varlen kernel over paged K/V, when flash-attn is installed; CUDA.

`auto` is flash_attn on CUDA when installed, else triton (it ships with CUDA builds of torch), else sdpa; on CPU
cpu_kernel in float32, else sdpa.
"""

from __future__ import annotations

import importlib.util
from enum import Enum

import torch


class AttentionBackend(str, Enum):
    SDPA = "sdpa"
    CPU_KERNEL = "cpu_kernel"
    TRITON = "triton"
    FLASH_ATTN = "flash_attn"


def resolve_attention_backend(name: str, device: torch.device, dtype: torch.dtype) -> AttentionBackend:
    """The backend ATTENTION_BACKEND `name` asks for on `device` in `dtype`; ValueError when it cannot run there."""
    if name == "auto":
        return default_attention_backend(device, dtype)
    try:
        backend = AttentionBackend(name)
    except ValueError:
        choices = ", ".join(["auto", *(backend.value for backend in AttentionBackend)])
        raise ValueError(f"ATTENTION_BACKEND {name!r} is not one of {choices}") from None
    reason = unavailable_reason(backend, device, dtype)
    if reason is not None:
        raise ValueError(f"ATTENTION_BACKEND={name} on {device.type} in {dtype}: {reason}")
    return backend


def default_attention_backend(device: torch.device, dtype: torch.dtype) -> AttentionBackend:
    if device.type == "cuda":
        for backend in (AttentionBackend.FLASH_ATTN, AttentionBackend.TRITON):
            if unavailable_reason(backend, device, dtype) is None:
                return backend
        return AttentionBackend.SDPA
    return AttentionBackend.CPU_KERNEL if dtype == torch.float32 else AttentionBackend.SDPA


def unavailable_reason(backend: AttentionBackend, device: torch.device, dtype: torch.dtype) -> str | None:
    """Why `backend` cannot run on `device` in `dtype`; None when it can."""
    if backend is AttentionBackend.FLASH_ATTN:
        if device.type != "cuda" or importlib.util.find_spec("flash_attn") is None:
            return "flash-attn runs on CUDA devices, with the flash-attn package installed"
    elif backend is AttentionBackend.CPU_KERNEL:
        if device.type != "cpu" or dtype != torch.float32:
            return "the C decode kernel runs on CPU in float32"
    elif backend is AttentionBackend.TRITON:
        if importlib.util.find_spec("triton") is None:
            return "the triton package is not installed"
        if device.type == "cpu" and not _is_triton_interpreted():
            return "Triton kernels run on CPU tensors only under its interpreter (TRITON_INTERPRET=1), for tests"
    return None


def _is_triton_interpreted() -> bool:
    import triton  # only asked once triton is known to be installed

    return bool(triton.knobs.runtime.interpret)
