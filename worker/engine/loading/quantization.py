"""Which quantization a worker loads its model with, decided before any weights load, and refused with an error
naming what is missing when this machine cannot run it.

`QUANTIZATION` is `auto` (the checkpoint's own `quantization_config`, or none), `none` (a float checkpoint only),
a method to quantize a float checkpoint with while it loads (`LOAD_TIME_METHODS`), or the `quant_method` a
pre-quantized checkpoint must carry (`gptq`, `awq`, `compressed-tensors`, `torchao`, `bitsandbytes`). Every method
runs through transformers' own quantizer; a worker never falls back to another method or to float weights.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from transformers import BitsAndBytesConfig, PretrainedConfig, TorchAoConfig

AUTO, NONE = "auto", "none"
# The package each checkpoint method's transformers quantizer imports, and whether its kernels need CUDA. GPTQ and
# AWQ load through gptqmodel in transformers 5 (its CPU kernels included); optimum too for GPTQ.
METHOD_PACKAGES: dict[str, tuple[str, ...]] = {
    "gptq": ("gptqmodel", "optimum"),
    "awq": ("gptqmodel",),
    "compressed-tensors": ("compressed_tensors",),
    "torchao": ("torchao",),
    "bitsandbytes": ("bitsandbytes",),
}
# The versions transformers' quantizers check for, named in the refusal when a package is missing
PACKAGE_REQUIREMENTS = {"gptqmodel": "gptqmodel>=1.4.3", "optimum": "optimum>=1.24.0"}
# torchao configs whose kernels exist on CUDA only: Int4WeightOnlyConfig's packings are tinygemm's and fbgemm's
TORCHAO_CUDA_ONLY_CONFIGS = ("Int4WeightOnlyConfig",)


class UnsupportedQuantizationError(ValueError):
    """A quantization this worker cannot load or run; the message names what is missing."""


@dataclass(frozen=True)
class Quantization:
    """What the worker's model is quantized with: `method` is transformers' quant_method ("none" for float
    weights), `scheme` what within it (int8 weight-only, W4A16, 4-bit nf4...)."""

    method: str
    scheme: str
    load_config: Any = None  # a transformers quantization config to quantize a float checkpoint at load; else None

    @property
    def name(self) -> str:
        """As /v1/models and /health/ready show it: "none", or "<method>:<scheme>"."""
        return NONE if self.method == NONE else f"{self.method}:{self.scheme}"


def torchao_int8() -> TorchAoConfig:
    from torchao.quantization import Int8WeightOnlyConfig

    return TorchAoConfig(Int8WeightOnlyConfig())


def torchao_int4(device: torch.device) -> TorchAoConfig:
    """Int4 weights in groups of 32: torchao's int4 kernels (Int4WeightOnlyConfig) are CUDA's; on CPU its
    IntxWeightOnlyConfig stores int4 values in int8 and dequantizes per group."""
    from torchao.quantization import Int4WeightOnlyConfig, IntxWeightOnlyConfig, PerGroup

    if device.type == "cuda":
        return TorchAoConfig(Int4WeightOnlyConfig(group_size=32))
    return TorchAoConfig(IntxWeightOnlyConfig(weight_dtype=torch.int4, granularity=PerGroup(32)))


# QUANTIZATION values that quantize a float checkpoint while it loads: (method, scheme, config for the device)
LOAD_TIME_METHODS: dict[str, tuple[str, str, Callable[[torch.device], Any]]] = {
    "torchao_int8": ("torchao", "int8_weight_only", lambda _: torchao_int8()),
    "torchao_int4": ("torchao", "int4_weight_only", torchao_int4),
    "bitsandbytes_8bit": ("bitsandbytes", "8bit", lambda _: BitsAndBytesConfig(load_in_8bit=True)),
    "bitsandbytes_4bit": (
        "bitsandbytes",
        "4bit-nf4",
        lambda _: BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.float32
        ),
    ),
}


def resolve_quantization(requested: str, model_config: PretrainedConfig, device: torch.device) -> Quantization:
    """The quantization QUANTIZATION=`requested` loads `model_config`'s checkpoint with on `device`; raises
    UnsupportedQuantizationError when the two disagree, or when a package or CUDA it needs is missing."""
    checkpoint = checkpoint_quantization(model_config)
    if requested in LOAD_TIME_METHODS:
        if checkpoint is not None:
            raise UnsupportedQuantizationError(
                f"QUANTIZATION={requested} quantizes a float checkpoint at load, but this checkpoint is already "
                f"quantized with {checkpoint.name}; set QUANTIZATION=auto to serve it as it is"
            )
        method, scheme, make_config = LOAD_TIME_METHODS[requested]
        check_runnable(method, device)
        return Quantization(method, scheme, make_config(device))
    known = (AUTO, NONE, *METHOD_PACKAGES, *LOAD_TIME_METHODS)
    if requested not in known:
        raise UnsupportedQuantizationError(f"QUANTIZATION={requested!r} is not one of {', '.join(known)}")
    if checkpoint is None:
        if requested not in (AUTO, NONE):
            raise UnsupportedQuantizationError(
                f"QUANTIZATION={requested} needs a checkpoint quantized with {requested}, and this one has float "
                "weights (no quantization_config in its config.json); make one with scripts/quantize_checkpoint.py"
            )
        return Quantization(NONE, NONE)
    if requested not in (AUTO, checkpoint.method):
        raise UnsupportedQuantizationError(
            f"QUANTIZATION={requested}, but the checkpoint is quantized with {checkpoint.name}; a worker never "
            "serves another method than the one asked for"
        )
    check_runnable(checkpoint.method, device, checkpoint.scheme)
    return checkpoint


def checkpoint_quantization(model_config: PretrainedConfig) -> Quantization | None:
    """The method and scheme of the checkpoint's own quantization_config, or None for float weights."""
    raw = getattr(model_config, "quantization_config", None)
    if raw is None:
        return None
    settings = raw if isinstance(raw, Mapping) else raw.to_dict()
    method = str(settings.get("quant_method", "unknown"))
    return Quantization(method, describe_scheme(method, settings))


def describe_scheme(method: str, settings: Mapping[str, Any]) -> str:
    if method in ("gptq", "awq"):
        return f"{settings.get('bits')}bit-g{settings.get('group_size')}"
    if method == "bitsandbytes":
        return "8bit" if settings.get("load_in_8bit") else f"4bit-{settings.get('bnb_4bit_quant_type', 'fp4')}"
    if method == "torchao":
        quant_type = settings.get("quant_type", {})
        default = quant_type.get("default", quant_type) if isinstance(quant_type, Mapping) else quant_type
        return str(default.get("_type", default)) if isinstance(default, Mapping) else str(default)
    if method == "compressed-tensors":
        return str(settings.get("format", "unknown"))
    return "unknown"


def check_runnable(method: str, device: torch.device, scheme: str = "") -> None:
    """Raises UnsupportedQuantizationError naming each package `method` needs that is not installed, or its need
    for CUDA on another device."""
    if method not in METHOD_PACKAGES:
        known = ", ".join(METHOD_PACKAGES)
        raise UnsupportedQuantizationError(f"the quantization method {method!r} is not one the worker loads ({known})")
    missing = [package for package in METHOD_PACKAGES[method] if importlib.util.find_spec(package) is None]
    if missing:
        wanted = ", ".join(PACKAGE_REQUIREMENTS.get(package, package) for package in missing)
        raise UnsupportedQuantizationError(
            f"{method} checkpoints load through transformers' {method} quantizer, which needs {wanted}; not "
            "installed here"
        )
    if method == "torchao" and scheme in TORCHAO_CUDA_ONLY_CONFIGS and device.type != "cuda":
        raise UnsupportedQuantizationError(
            f"torchao's {scheme} runs on CUDA only (its kernels have no CPU path); on CPU quantize with "
            "IntxWeightOnlyConfig (QUANTIZATION=torchao_int4) or Int8WeightOnlyConfig instead"
        )


def check_loaded_model_runnable(model: torch.nn.Module, device: torch.device) -> None:
    """What only the loaded modules tell: bitsandbytes' 4-bit CPU matmul needs every layer's input width to be a
    whole number of its blocks (else it fails at the first forward pass)."""
    if device.type == "cuda":
        return
    for name, module in model.named_modules():
        quant_state = getattr(getattr(module, "weight", None), "quant_state", None)
        if quant_state is not None and module.in_features % quant_state.blocksize:
            raise UnsupportedQuantizationError(
                f"bitsandbytes' 4-bit CPU kernel needs input widths that are multiples of {quant_state.blocksize}; "
                f"{name} has {module.in_features} (it runs on CUDA)"
            )
