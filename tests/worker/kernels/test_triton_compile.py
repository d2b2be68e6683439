"""The Triton kernels compile for CUDA GPUs on a machine without one: to cubins for an H100 (sm_90, bfloat16, the
serving dtype) and an A100 (sm_80, float32, what the GPU tests compare in), with the compile-time arguments the
launchers pass and the ptxas that triton ships. The interpreter cannot tell what the GPU compiler refuses (a construct,
a tile shape); this can. In a subprocess: the interpreter is on in this one."""

from __future__ import annotations

import os
import subprocess
import sys

from tasks.config import REPO_ROOT

PROBE = """
import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from worker.kernels import triton_decode, triton_prefill

assert not triton_decode.IS_INTERPRETED
GROUP, HEAD_DIM = 8, 128
FLOAT_ARGUMENTS = ("scale_log2", "cap_scale", "cap_log2")
PLAIN = {"HAS_SOFTCAP": False, "HAS_SINKS": False, "KV_CODES": 0}
# soft-capped scores, sinks in the output and the merge
EVERY_VARIANT = {"HAS_SOFTCAP": True, "HAS_SINKS": True, "KV_CODES": 0}
CODES = {1: "i8", 2: "u8"}  # KV_CACHE_DTYPE int8 and fp8_e4m3: the pool's elements


def compile_for(kernel, dtype, constants, capability):
    def type_of(name):
        if name in constants:
            return "constexpr"
        if name in ("k_cache_ptr", "v_cache_ptr") and constants.get("KV_CODES"):
            return "*" + CODES[constants["KV_CODES"]]
        if name in ("query_ptr", "k_cache_ptr", "v_cache_ptr", "out_ptr"):
            return "*" + dtype
        if name in ("partial_ptr", "lse_ptr", "sinks_ptr", "k_scales_ptr", "v_scales_ptr"):
            return "*fp32"
        return "*i32" if name.endswith("_ptr") else "fp32" if name in FLOAT_ARGUMENTS else "i32"

    signature = {name: type_of(name) for name in kernel.arg_names}
    constexprs = {(kernel.arg_names.index(name),): value for name, value in constants.items()}
    triton.compile(ASTSource(kernel, signature, constexprs), target=GPUTarget("cuda", capability, 32))


for dtype, torch_dtype, capability, variant in (
    ("bf16", torch.bfloat16, 90, PLAIN),
    ("fp32", torch.float32, 80, PLAIN),
    ("bf16", torch.bfloat16, 90, EVERY_VARIANT),
    ("bf16", torch.bfloat16, 90, {**PLAIN, "KV_CODES": 1}),
    ("bf16", torch.bfloat16, 90, {**PLAIN, "KV_CODES": 2}),
):
    for splits in (1, 4):
        constants = triton_decode.decode_constants(GROUP, HEAD_DIM, torch_dtype, splits)
        compile_for(triton_decode._decode_kernel, dtype, {**constants, **variant}, capability)
    merge = triton_decode.merge_constants(HEAD_DIM, 4)
    compile_for(triton_decode._merge_splits_kernel, dtype, {**merge, "HAS_SINKS": variant["HAS_SINKS"]}, capability)
    constants = triton_prefill.prefill_constants(GROUP, HEAD_DIM, torch_dtype)
    compile_for(triton_prefill._prefill_kernel, dtype, {**constants, **variant}, capability)
"""


def test_the_kernels_compile_for_cuda_gpus_without_one() -> None:
    environ = {name: value for name, value in os.environ.items() if name != "TRITON_INTERPRET"}
    result = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=REPO_ROOT, env=environ, capture_output=True, text=True, timeout=240
    )
    assert result.returncode == 0, result.stderr[-3000:]
