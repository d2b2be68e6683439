"""Quantized weights and a quantized KV cache against the float model, on the tiny model and the random-init 135M
model: memory of weights and KV, decode tokens/s at 1 and 32 concurrent requests (engine in process), and quality
against the float32 model with a float32 KV pool.

    .venv/bin/python -m bench.quantization [--models tiny,135m] [--threads 2] [--out table.md] [--plot out.png]

Each variant changes one thing from the float32 baseline: the weights (every format the worker serves on CPU:
torchao int8 and int4 weight-only, bitsandbytes 8-bit, compressed-tensors W8A8, W8A16, W4A16 and FP8), or the KV
pool's dtype (int8, fp8_e4m3). Quality, against the baseline of the same model:
- greedy agreement: over 64 random prompts, the fraction of the baseline's greedy tokens reproduced before the first
  different one;
- mean KL (nats) of the next-token distributions at every position of held-out texts from the tiny model's corpus
  (paragraphs generated with another seed than its training set), and the tiny model's perplexity on them.
The markdown table goes to stdout (and --out), the plot to --plot; progress to the log.
"""

from __future__ import annotations

import argparse
import logging
import shlex
import statistics
import sys
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from transformers import PreTrainedTokenizerFast

from bench.engine_throughput import cpu_description
from bench.quantization.measures import (
    decode_tokens_per_s,
    greedy_agreement,
    mean_kl,
    perplexity,
    random_prompts,
    run_requests,
    text_logprobs,
    weight_bytes,
)
from bench.quantization.report import Row, format_table, plot_rows
from bench.random_model import TINY_MODEL, random_model_dir
from scripts.quantize_checkpoint import COMPRESSED_TENSORS_PRESETS, quantize_checkpoint
from scripts.tiny_corpus import build_paragraphs
from tasks.config import Config
from worker.engine.model_runner import ModelRunner

logger = logging.getLogger("bench.quantization")

WEIGHTS = ("none", "torchao_int8", "torchao_int4", "bitsandbytes_8bit", *COMPRESSED_TENSORS_PRESETS)
KV_DTYPES = ("int8", "fp8_e4m3")
HELD_OUT_SEED = 1000  # the tiny model trained on seed 0's corpus
TEXT_TOKENS = 128
KV_CACHE_TOKENS = 8192


@dataclass(frozen=True)
class Variant:
    weights: str  # QUANTIZATION's load-time method, a compressed-tensors preset, or "none"
    kv_cache_dtype: str


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="tiny,135m", help="comma-separated: tiny (models/tiny), 135m (random)")
    parser.add_argument("--weights", default=",".join(WEIGHTS[1:]), help=f"comma-separated, of {WEIGHTS[1:]}")
    parser.add_argument("--kv", default=",".join(KV_DTYPES), help=f"comma-separated, of {KV_DTYPES}")
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op threads (CPU_THREADS)")
    parser.add_argument("--num-prompts", type=int, default=64, help="greedy-agreement prompts")
    parser.add_argument("--greedy-tokens", type=int, default=16)
    parser.add_argument("--num-texts", type=int, default=32, help="held-out texts for KL and perplexity")
    parser.add_argument("--prompt-len", type=int, default=64, help="prompt tokens of the speed runs")
    parser.add_argument("--decode-tokens", type=int, default=64, help="tokens each speed-run request decodes")
    parser.add_argument("--concurrency", default="1,32")
    parser.add_argument("--repeats", type=int, default=3, help="speed runs per concurrency; the median is kept")
    parser.add_argument("--out", type=Path, help="also write the markdown table here")
    parser.add_argument("--plot", type=Path, help="write the plot (PNG) here")
    return parser.parse_args(argv)


def model_dir(name: str) -> Path:
    return TINY_MODEL if name == "tiny" else random_model_dir(name, torch.float32)


def variant_config(base: Config, variant: Variant, model: Path, workdir: Path) -> Config:
    """The worker's Config for `variant`: compressed-tensors checkpoints are made first, with their own library."""
    if variant.weights in COMPRESSED_TENSORS_PRESETS:
        out = workdir / f"{model.name}-{variant.weights}"
        if not out.exists():
            quantize_checkpoint(model, variant.weights, out)
        return replace(base, model=str(out), quantization="auto", kv_cache_dtype=variant.kv_cache_dtype)
    return replace(base, model=str(model), quantization=variant.weights, kv_cache_dtype=variant.kv_cache_dtype)


def held_out_texts(num: int) -> list[list[int]]:
    tokenizer = PreTrainedTokenizerFast.from_pretrained(TINY_MODEL)
    paragraphs = build_paragraphs(num * 4, HELD_OUT_SEED)
    texts = [tokenizer(paragraph)["input_ids"][:TEXT_TOKENS] for paragraph in paragraphs]
    return [text for text in texts if len(text) >= 16][:num]


@dataclass(frozen=True)
class Reference:
    greedy: list[list[int]]
    logprobs: list[torch.Tensor]


def measure(
    config: Config, variant: Variant, model_name: str, args: argparse.Namespace, reference: Reference | None
) -> tuple[Row, Reference]:
    runner = ModelRunner(config)
    runner.eos_token_ids = frozenset()  # every request decodes exactly its tokens
    vocab = runner.model.config.vocab_size
    prompts = random_prompts(args.num_prompts, 24, vocab, seed=1)
    greedy = [tokens for tokens, _ in run_requests(runner, config, prompts, args.greedy_tokens)]
    texts = held_out_texts(args.num_texts)
    logprobs = text_logprobs(runner, texts)
    speeds = {}
    for concurrency in (int(c) for c in args.concurrency.split(",")):
        speed_prompts = random_prompts(concurrency, args.prompt_len, vocab, seed=2)
        rounds = [run_requests(runner, config, speed_prompts, args.decode_tokens) for _ in range(args.repeats)]
        speeds[concurrency] = statistics.median(decode_tokens_per_s(runs) for runs in rounds)
    reference = reference or Reference(greedy, logprobs)
    row = Row(
        model=model_name,
        weights=variant.weights,
        kv_cache_dtype=runner.kv_cache_dtype_name,
        weight_mib=weight_bytes(runner.model) / 2**20,
        kv_bytes_per_token=runner.kv_pool.num_bytes // runner.kv_pool.num_tokens,
        tokens_per_s=speeds,
        greedy_agreement=greedy_agreement(reference.greedy, greedy),
        mean_kl=mean_kl(reference.logprobs, logprobs),
        perplexity=perplexity(logprobs, texts) if model_name == "tiny" else None,
    )
    logger.info("%s (loaded as %s)", row, runner.quantization.name)
    return row, reference


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    args = parse_args(argv)
    torch.manual_seed(0)
    variants = [Variant("none", "auto")]
    variants += [Variant(weights, "auto") for weights in args.weights.split(",") if weights]
    variants += [Variant("none", kv) for kv in args.kv.split(",") if kv]
    rows = []
    with tempfile.TemporaryDirectory() as workdir:
        for model_name in args.models.split(","):
            model = model_dir(model_name)
            base = Config(
                device="cpu",
                cpu_threads=args.threads,
                max_num_seqs=32,
                kv_cache_tokens=KV_CACHE_TOKENS,
                speculative_method="none",  # plain decoding: one token per request per step
            )
            reference = None
            for variant in variants:
                config = variant_config(base, variant, model, Path(workdir))
                row, reference = measure(config, variant, model_name, args, reference)
                rows.append(row)
    command = shlex.join(["python", "-m", "bench.quantization", *(argv if argv is not None else sys.argv[1:])])
    header = f"`{command}`: {cpu_description()}, torch {torch.__version__}, {args.threads} torch threads"
    table = header + "\n\n" + format_table(rows)
    print(table)
    if args.out:
        args.out.write_text(table + "\n")
    if args.plot:
        plot_rows(rows, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
