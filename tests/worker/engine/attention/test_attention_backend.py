"""ATTENTION_BACKEND and DTYPE as the worker resolves them for its device."""

from __future__ import annotations

import importlib.util
from importlib.machinery import ModuleSpec

import pytest
import torch

from tasks.config import Config
from worker.engine import model_runner
from worker.engine.attention.backend import AttentionBackend, resolve_attention_backend
from worker.engine.model_runner import load_attention_backend, resolve_dtype

CPU, CUDA = torch.device("cpu"), torch.device("cuda")
REAL_FIND_SPEC = importlib.util.find_spec


def installed(monkeypatch: pytest.MonkeyPatch, **packages: bool) -> None:
    """Makes the named packages look installed (True) or absent (False), whatever this machine has."""

    def find_spec(name: str, package: str | None = None) -> ModuleSpec | None:
        if name in packages:
            return ModuleSpec(name, None) if packages[name] else None
        return REAL_FIND_SPEC(name, package)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)


def test_auto_on_cuda_is_flash_attn_when_installed_else_triton_else_sdpa(monkeypatch: pytest.MonkeyPatch) -> None:
    installed(monkeypatch, flash_attn=True, triton=True)
    assert resolve_attention_backend("auto", CUDA, torch.bfloat16) is AttentionBackend.FLASH_ATTN
    installed(monkeypatch, flash_attn=False, triton=True)
    assert resolve_attention_backend("auto", CUDA, torch.bfloat16) is AttentionBackend.TRITON
    installed(monkeypatch, flash_attn=False, triton=False)
    assert resolve_attention_backend("auto", CUDA, torch.float16) is AttentionBackend.SDPA


def test_auto_on_cpu_is_the_c_kernel_in_float32_else_sdpa() -> None:
    assert resolve_attention_backend("auto", CPU, torch.float32) is AttentionBackend.CPU_KERNEL
    assert resolve_attention_backend("auto", CPU, torch.bfloat16) is AttentionBackend.SDPA


def test_a_backend_asked_for_where_it_cannot_run_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    installed(monkeypatch, flash_attn=False, triton=True)
    with pytest.raises(ValueError, match="flash-attn"):
        resolve_attention_backend("flash_attn", CUDA, torch.bfloat16)
    with pytest.raises(ValueError, match="CPU in float32"):
        resolve_attention_backend("cpu_kernel", CUDA, torch.float32)
    with pytest.raises(ValueError, match="CPU in float32"):
        resolve_attention_backend("cpu_kernel", CPU, torch.bfloat16)
    with pytest.raises(ValueError, match=r"not one of auto, sdpa, cpu_kernel, triton, flash_attn"):
        resolve_attention_backend("xformers", CPU, torch.float32)
    installed(monkeypatch, triton=False)
    with pytest.raises(ValueError, match="triton package"):
        resolve_attention_backend("triton", CUDA, torch.bfloat16)


def test_triton_on_cpu_needs_the_interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ValueError, match="TRITON_INTERPRET=1"):
        resolve_attention_backend("triton", CPU, torch.float32)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert resolve_attention_backend("triton", CPU, torch.float32) is AttentionBackend.TRITON
    assert resolve_attention_backend("sdpa", CPU, torch.float32) is AttentionBackend.SDPA


def test_the_c_kernel_that_cannot_be_built_leaves_sdpa(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(model_runner, "load_cpu_decode_kernel", lambda: None)
    assert load_attention_backend(Config(), CPU, torch.float32) == (AttentionBackend.SDPA, None)


def test_dtype_auto_is_bfloat16_where_native_else_float16_on_cuda_and_float32_on_cpu(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert resolve_dtype("auto", CPU) is torch.float32
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: True)  # Ampere on
    assert resolve_dtype("auto", CUDA) is torch.bfloat16
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: including_emulation)
    assert resolve_dtype("auto", CUDA) is torch.float16  # bfloat16 only emulated, before Ampere: not taken
    assert resolve_dtype("float16", CPU) is torch.float16
    with pytest.raises(ValueError, match="not one of auto, float32, bfloat16, float16"):
        resolve_dtype("float8", CUDA)


def test_both_come_from_the_environment() -> None:
    config = Config.from_env({"ATTENTION_BACKEND": "triton", "DTYPE": "float16"})
    assert (config.attention_backend, config.dtype) == ("triton", "float16")
    assert (Config().attention_backend, Config().dtype) == ("auto", "auto")
