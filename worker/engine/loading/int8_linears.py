"""torchao int8 weight-only linears on CPU run through the int8 matmul kernel (worker/kernels/int8_weight_matmul.c)
instead of torchao's own CPU path, which widens the whole weight to float on every call.

The checkpoint still loads through transformers' TorchAoHfQuantizer and the weights stay torchao's Int8Tensor
(saved, sized and shown as they are); only the matmul of each eligible linear's forward is chosen here. Eligible:
torchao's weight-only int8 with one scale per output channel (Int8WeightOnlyConfig's default), which torchao itself
computes as `mm(x, qdata.t().float()) * scale + bias`; the kernel computes the same products in float32, summed in
another order. Activations of another dtype than float32 go through torchao's path unchanged.

Under TORCH_COMPILE the forward calls the kernel through `steerbatch::int8_weight_linear`, a custom op the graph
keeps opaque: Dynamo cannot trace a ctypes call, and the graph breaks it made at each linear ended in a recompile
that the warm compiled forward refuses (every step failed). Eager calls the kernel directly, without the op's
dispatch.
"""

from __future__ import annotations

import functools
import logging
import types
from collections.abc import Callable

import torch

from worker.kernels.int8_matmul_kernel import Int8MatmulKernel, load_int8_matmul_kernel

logger = logging.getLogger(__name__)

# A fragment of the namespace compiled_forward.py defines: the two register their ops in either order
_LIBRARY = torch.library.Library("steerbatch", "FRAGMENT")
_LIBRARY.define("int8_weight_linear(Tensor x, Tensor weight, Tensor scale, Tensor? bias) -> Tensor")


@functools.cache
def _process_kernel() -> Int8MatmulKernel | None:
    """The kernel, loaded once per process: what every linear and the custom op call."""
    return load_int8_matmul_kernel()


def _int8_weight_linear(
    x: torch.Tensor,  # [M, K] float32
    weight: torch.Tensor,  # [N, K] int8
    scale: torch.Tensor,  # [N] float32
    bias: torch.Tensor | None,  # [N] float32
) -> torch.Tensor:
    """[M, N]: the kernel's `(x @ weight.T) * scale + bias`; only reached on linears the kernel was loaded for."""
    kernel = _process_kernel()
    if kernel is None:
        raise RuntimeError("steerbatch::int8_weight_linear called where the int8 matmul kernel could not be built")
    return kernel(x.contiguous(), weight, scale, bias)


_LIBRARY.impl("int8_weight_linear", _int8_weight_linear, "CompositeExplicitAutograd")


@torch.library.register_fake("steerbatch::int8_weight_linear")
def _(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return x.new_empty(x.shape[0], weight.shape[0])


def run_int8_linears_on_kernel(model: torch.nn.Module) -> int:
    """Points the forward of every eligible torchao int8 linear of `model` at the kernel; returns how many (0 when
    the kernel cannot be built: torchao's path then runs, and the log says so)."""
    eligible = [module for module in model.modules() if _int8_weight(module) is not None]
    if not eligible:
        return 0
    kernel = _process_kernel()
    if kernel is None:
        return 0
    for module in eligible:
        weight = _int8_weight(module)
        module.int8_codes = weight.qdata.contiguous()
        module.int8_scale = weight.scale.reshape(-1).to(torch.float32).contiguous()
        module.forward = types.MethodType(_kernel_forward(kernel), module)
    logger.info("%d torchao int8 linears run on the int8 matmul kernel", len(eligible))
    return len(eligible)


def _int8_weight(module: torch.nn.Module) -> torch.Tensor | None:
    """The module's torchao weight-only Int8Tensor with per-channel scales, on CPU; else None."""
    weight = getattr(module, "weight", None)
    if not isinstance(module, torch.nn.Linear) or type(weight).__name__ != "Int8Tensor":
        return None
    qdata, scale = weight.qdata, weight.scale
    if weight.act_quant_kwargs is not None or weight.act_pre_scale is not None:  # dynamic or static activations
        return None
    if qdata.ndim != 2 or qdata.device.type != "cpu" or list(weight.block_size) != [1, qdata.shape[1]]:
        return None
    if scale.numel() != qdata.shape[0] or (module.bias is not None and module.bias.dtype != torch.float32):
        return None
    return weight


def _kernel_forward(kernel: Int8MatmulKernel) -> Callable[[torch.nn.Linear, torch.Tensor], torch.Tensor]:
    def forward(self: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
        if x.dtype != torch.float32:
            return torch.nn.functional.linear(x, self.weight, self.bias)
        rows = x.reshape(-1, x.shape[-1])
        if torch.compiler.is_compiling():
            out = torch.ops.steerbatch.int8_weight_linear(rows, self.int8_codes, self.int8_scale, self.bias)
        else:
            out = kernel(rows.contiguous(), self.int8_codes, self.int8_scale, self.bias)
        return out.reshape(*x.shape[:-1], out.shape[-1])

    return forward
