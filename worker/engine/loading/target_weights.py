"""The served model's weights, loaded once with the quantization QUANTIZATION and its checkpoint decide."""

from __future__ import annotations

import logging

import torch
from transformers import AutoModelForCausalLM, PretrainedConfig, PreTrainedModel

from worker.engine.loading.int8_linears import run_int8_linears_on_kernel
from worker.engine.loading.quantization import Quantization, check_loaded_model_runnable, resolve_quantization

logger = logging.getLogger(__name__)


def load_target_weights(
    name: str,
    model_config: PretrainedConfig,
    requested_quantization: str,
    device: torch.device,
    dtype: torch.dtype,
    attention: str,
) -> tuple[PreTrainedModel, Quantization]:
    """The model at `name` on `device` and how it is quantized; raises UnsupportedQuantizationError, before any
    weights load where the config tells, when this machine cannot run that quantization."""
    quantization = resolve_quantization(requested_quantization, model_config, device)
    if quantization.method == "none":
        model = AutoModelForCausalLM.from_pretrained(
            name, config=model_config, dtype=dtype, attn_implementation=attention
        )
        return model.to(device).eval(), quantization
    # quantized weights are placed by their quantizer as they load: bitsandbytes' refuse a later .to(device)
    model = AutoModelForCausalLM.from_pretrained(
        name,
        config=model_config,
        dtype=dtype,
        attn_implementation=attention,
        quantization_config=quantization.load_config,
        device_map=str(device),
    )
    model.eval()
    check_loaded_model_runnable(model, device)
    if device.type == "cpu":
        run_int8_linears_on_kernel(model)
    logger.info("weights quantized with %s", quantization.name)
    return model, quantization
