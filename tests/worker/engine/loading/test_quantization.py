"""Which quantization a worker loads, decided from QUANTIZATION and the checkpoint's config before any weights load,
and the errors that name what is missing."""

from __future__ import annotations

import importlib.util

import pytest
import torch
from transformers import LlamaConfig

from worker.engine.loading.quantization import UnsupportedQuantizationError, resolve_quantization

CPU = torch.device("cpu")
NO_GPTQMODEL = pytest.mark.skipif(importlib.util.find_spec("gptqmodel") is not None, reason="gptqmodel is installed")


def config_with(quantization_config: dict | None) -> LlamaConfig:
    config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=2)
    if quantization_config is not None:
        config.quantization_config = quantization_config
    return config


TORCHAO_INT8 = {"quant_method": "torchao", "quant_type": {"default": {"_type": "Int8WeightOnlyConfig", "_data": {}}}}


@pytest.mark.parametrize(
    ("requested", "checkpoint", "expected"),
    [
        ("auto", None, "none"),
        ("none", None, "none"),
        ("torchao_int8", None, "torchao:int8_weight_only"),
        ("bitsandbytes_4bit", None, "bitsandbytes:4bit-nf4"),
        ("auto", TORCHAO_INT8, "torchao:Int8WeightOnlyConfig"),
        ("torchao", TORCHAO_INT8, "torchao:Int8WeightOnlyConfig"),
        ("auto", {"quant_method": "bitsandbytes", "load_in_8bit": True}, "bitsandbytes:8bit"),
        ("auto", {"quant_method": "compressed-tensors", "format": "int-quantized"}, "compressed-tensors:int-quantized"),
    ],
)
def test_the_checkpoint_or_quantization_decides(requested: str, checkpoint: dict | None, expected: str) -> None:
    assert resolve_quantization(requested, config_with(checkpoint), CPU).name == expected


@pytest.mark.parametrize(
    ("requested", "checkpoint", "message"),
    [
        pytest.param(
            "auto", {"quant_method": "gptq", "bits": 4, "group_size": 128}, r"gptqmodel>=1\.4\.3", marks=NO_GPTQMODEL
        ),
        pytest.param(
            "auto", {"quant_method": "awq", "bits": 4, "group_size": 128}, "needs gptqmodel", marks=NO_GPTQMODEL
        ),
        ("auto", {"quant_method": "torchao", "quant_type": {"default": {"_type": "Int4WeightOnlyConfig"}}}, "CUDA"),
        ("auto", {"quant_method": "hqq"}, "'hqq' is not one the worker loads"),
        ("gptq", None, "float weights"),
        ("bitsandbytes", TORCHAO_INT8, "quantized with torchao:Int8WeightOnlyConfig"),
        ("torchao_int8", TORCHAO_INT8, "already quantized"),
        ("int3", None, "is not one of"),
    ],
)
def test_what_cannot_run_is_refused_naming_what_is_missing(
    requested: str, checkpoint: dict | None, message: str
) -> None:
    with pytest.raises(UnsupportedQuantizationError, match=message):
        resolve_quantization(requested, config_with(checkpoint), CPU)
