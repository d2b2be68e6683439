"""Decode tokens/s of one weight format against float32 weights, both loaded in one process and run in alternating
rounds, so that both see the same moments of a shared machine's load: each round's ratio, and the medians.

    .venv/bin/python -m bench.quantization.interleaved_speed [--model 135m] [--weights torchao_int8] \
        [--concurrency 1] [--rounds 7] [--threads 2] [--prompt-len 64] [--decode-tokens 32]
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
from dataclasses import replace

import torch

from bench.quantization.__main__ import model_dir
from bench.quantization.measures import decode_tokens_per_s, random_prompts, run_requests
from tasks.config import Config
from worker.engine.model_runner import ModelRunner

logger = logging.getLogger("bench.quantization.interleaved_speed")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="135m", help="tiny (models/tiny) or 135m (random)")
    parser.add_argument("--weights", default="torchao_int8", help="a QUANTIZATION load-time method")
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--decode-tokens", type=int, default=32)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    base = Config(
        device="cpu",
        model=str(model_dir(args.model)),
        cpu_threads=args.threads,
        max_num_seqs=max(32, args.concurrency),
        kv_cache_tokens=8192,
        speculative_method="none",
    )
    runners = {}
    for weights in ("none", args.weights):
        config = replace(base, quantization=weights)
        runner = ModelRunner(config)
        runner.eos_token_ids = frozenset()  # every request decodes exactly its tokens
        runners[weights] = (runner, config)
    prompts = random_prompts(args.concurrency, args.prompt_len, base_vocab(runners), seed=2)
    speeds: dict[str, list[float]] = {weights: [] for weights in runners}
    for _ in range(args.rounds):
        for weights, (runner, config) in runners.items():
            speeds[weights].append(decode_tokens_per_s(run_requests(runner, config, prompts, args.decode_tokens)))
    ratios = [quantized / float32 for float32, quantized in zip(speeds["none"], speeds[args.weights], strict=True)]
    print(f"{args.model}, {args.concurrency} concurrent, {args.threads} torch threads, torch {torch.__version__}")
    for weights, values in speeds.items():
        rounds = " ".join(f"{value:.1f}" for value in values)
        print(f"{weights}: median {statistics.median(values):.2f} decode tok/s (rounds: {rounds})")
    rounds = " ".join(f"{ratio:.2f}" for ratio in ratios)
    print(f"{args.weights} / float32: median of rounds {statistics.median(ratios):.2f}x (rounds: {rounds})")
    return 0


def base_vocab(runners: dict[str, tuple[ModelRunner, Config]]) -> int:
    runner, _ = runners["none"]
    return int(runner.model.config.vocab_size)


if __name__ == "__main__":
    sys.exit(main())
