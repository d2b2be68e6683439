"""Make a quantized checkpoint from a float one, with each library's own quantize path, for a worker to serve.

    .venv/bin/python -m scripts.quantize_checkpoint --model models/tiny --method torchao_int8 --out models/tiny-int8

torchao (`quantize_` through transformers' TorchAoConfig) and bitsandbytes quantize the weights as they load and
save them; compressed-tensors formats (W8A8 INT8, W8A16, W4A16, FP8 dynamic) have their weight scales computed from
each weight's own range (round-to-nearest, compressed-tensors' `calculate_qparams`; activations are quantized
per token at run time, so no calibration data is needed), and are compressed and saved by its ModelCompressor.
GPTQ and AWQ (`--method gptq|awq`, the `gptq` extra) are calibrated by GPTQModel's own quantize on
`--calibration-file`'s text, tokenized with the model's tokenizer and cut into rows of `--calibration-tokens`.
The tokenizer files are copied beside the weights.
"""

from __future__ import annotations

import argparse
import logging
import shutil
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, PreTrainedModel, PreTrainedTokenizerFast

from scripts.quantize_gptqmodel import GPTQMODEL_FORMATS, GROUP_SIZE, quantize_with_gptqmodel
from worker.engine.loading.quantization import LOAD_TIME_METHODS

logger = logging.getLogger(__name__)

# compressed-tensors' preset schemes by the name this script takes
COMPRESSED_TENSORS_PRESETS = {
    "compressed_tensors_w8a8": "W8A8",
    "compressed_tensors_w8a16": "W8A16",
    "compressed_tensors_w4a16": "W4A16",
    "compressed_tensors_fp8": "FP8_DYNAMIC",
}
METHODS = (*LOAD_TIME_METHODS, *COMPRESSED_TENSORS_PRESETS, *GPTQMODEL_FORMATS)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json")


def quantize_checkpoint(
    model_dir: Path, method: str, out_dir: Path, calibration: list[list[int]] | None = None
) -> Path:
    """Writes `model_dir`'s model quantized with `method` (one of METHODS) to `out_dir` and returns it; GPTQ and AWQ
    are calibrated on `calibration`'s token-id rows."""
    if method in LOAD_TIME_METHODS:
        make_config = LOAD_TIME_METHODS[method][2]
        model = AutoModelForCausalLM.from_pretrained(
            model_dir, dtype=torch.float32, quantization_config=make_config(torch.device("cpu")), device_map="cpu"
        )
        model.save_pretrained(out_dir)
    elif method in COMPRESSED_TENSORS_PRESETS:
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        save_compressed_tensors(model, COMPRESSED_TENSORS_PRESETS[method], out_dir)
    elif method in GPTQMODEL_FORMATS:
        if not calibration:
            raise ValueError(f"{method} is calibrated: give it token-id rows (--calibration-file)")
        quantize_with_gptqmodel(model_dir, method, out_dir, calibration)
    else:
        raise ValueError(f"method {method!r} is not one of {', '.join(METHODS)}")
    for name in TOKENIZER_FILES:
        if (model_dir / name).exists():
            shutil.copy(model_dir / name, out_dir / name)
    logger.info("wrote %s quantized with %s", out_dir, method)
    return out_dir


def save_compressed_tensors(model: PreTrainedModel, preset: str, out_dir: Path) -> None:
    """Every linear layer but the LM head quantized with compressed-tensors' `preset` scheme, saved compressed."""
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.quantization import QuantizationConfig, apply_quantization_config, preset_name_to_scheme

    scheme = preset_name_to_scheme(preset, ["Linear"])
    if scheme.weights.group_size is not None:
        scheme.weights.group_size = GROUP_SIZE
    apply_quantization_config(model, QuantizationConfig(config_groups={"group_0": scheme}, ignore=["lm_head"]))
    for module in model.modules():
        if getattr(module, "quantization_scheme", None) is not None:
            set_weight_qparams(module)
    compressor = ModelCompressor.from_pretrained_model(model)
    compressor.compress_model(model)
    model.save_pretrained(out_dir)
    compressor.update_config(str(out_dir))


def set_weight_qparams(module: torch.nn.Linear) -> None:
    """The module's weight scale (and zero point) from the range of each of its channels, groups or whole tensor."""
    from compressed_tensors.quantization import QuantizationStrategy
    from compressed_tensors.quantization.utils import calculate_qparams

    args = module.quantization_scheme.weights
    weight = module.weight.detach()  # [out, in]
    if args.strategy == QuantizationStrategy.GROUP:
        spans = weight.reshape(weight.shape[0], -1, args.group_size)  # [out, in / group, group]
    elif args.strategy == QuantizationStrategy.CHANNEL:
        spans = weight.reshape(weight.shape[0], 1, -1)  # [out, 1, in]
    else:
        spans = weight.reshape(1, 1, -1)  # the whole tensor
    scale, zero_point = calculate_qparams(spans.amin(-1), spans.amax(-1), args)
    module.weight_scale.data = scale.to(module.weight_scale.dtype).reshape(module.weight_scale.shape)
    if hasattr(module, "weight_zero_point"):
        module.weight_zero_point.data = zero_point.to(module.weight_zero_point.dtype).reshape(
            module.weight_zero_point.shape
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True, help="a float checkpoint's folder")
    parser.add_argument("--method", choices=METHODS, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--calibration-file", type=Path, help="gptq, awq: calibration text")
    parser.add_argument("--calibration-tokens", type=int, default=256, help="gptq, awq: tokens a calibration row")
    parser.add_argument("--calibration-rows", type=int, default=128, help="gptq, awq: at most this many rows")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    calibration = None
    if args.calibration_file is not None:
        calibration = calibration_rows(
            args.model, args.calibration_file, args.calibration_tokens, args.calibration_rows
        )
    quantize_checkpoint(args.model, args.method, args.out, calibration)


def calibration_rows(model_dir: Path, text_file: Path, row_tokens: int, max_rows: int) -> list[list[int]]:
    """`text_file` tokenized whole with the model's own tokenizer and cut into rows of `row_tokens` (GPTQModel drops
    rows under 10 tokens, so short lines are not rows of their own), at most `max_rows` of them."""
    tokenizer = PreTrainedTokenizerFast.from_pretrained(model_dir)
    ids = tokenizer.encode(text_file.read_text(), add_special_tokens=False)
    rows = [ids[start : start + row_tokens] for start in range(0, len(ids), row_tokens)][:max_rows]
    if len(rows) > 1 and len(rows[-1]) < row_tokens:
        rows.pop()  # the short remainder
    return rows


if __name__ == "__main__":
    main()
