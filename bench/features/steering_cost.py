"""Steering cost: throughput of our engine with 0 %, 50 % and 100 % of the rows steered, in one process.

    .venv/bin/python -m bench.features.steering_cost --model models/tiny [--num-requests 32] [--repeats 5]
        [--sae-id tiny/resid_post_2] [--feature 0] [--strength 8] [--threads N] [--out table.md]

Every run submits the same requests at t=0 (greedy, EOS ignored, so each generates exactly its own number of
tokens) to one ContinuousEngine, with prefix caching and speculation off; only which rows carry a steering spec
changes. Mixes are interleaved round by
round so that a neighbour's load on a shared CPU hits them alike; the table reports each mix's median. The target
is at least 0.9x of unsteered throughput with every row steered.
"""

from __future__ import annotations

import argparse
import logging
import shlex
import statistics
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from bench.engine_throughput import machine_description, special_token_ids
from bench.markdown_main import run_markdown_bench
from bench.workload import BenchRequest, WorkloadSpec, make_workload
from tasks.config import REPO_ROOT, Config
from tasks.messages.generation import SamplingParams
from tasks.messages.steering import SteeringFeature, SteeringSpec
from worker.engine.continuous_engine import ContinuousEngine
from worker.engine.interface import EngineOutput, EngineRequest
from worker.engine.model_runner import ModelRunner

logger = logging.getLogger("bench.features.steering_cost")

STEERED_FRACTIONS = (0.0, 0.5, 1.0)
TIMEOUT_S = 600.0


@dataclass(frozen=True)
class Run:
    fraction: float
    seconds: float
    num_tokens: int


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="models/tiny", help="HF model folder")
    parser.add_argument("--sae-root", default=str(REPO_ROOT / "models" / "saes"))
    parser.add_argument("--sae-id", default="tiny/resid_post_2")
    parser.add_argument("--feature", type=int, default=0, help="the SAE feature steered rows add")
    parser.add_argument("--strength", type=float, default=8.0)
    parser.add_argument("--num-requests", type=int, default=32)
    parser.add_argument("--prompt-len", type=int, nargs=2, default=(32, 128), metavar=("MIN", "MAX"))
    parser.add_argument("--output-len", type=int, nargs=2, default=(128, 128), metavar=("MIN", "MAX"))
    parser.add_argument("--repeats", type=int, default=5, help="runs per mix; the table shows the median")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--threads",
        type=int,
        default=torch.get_num_threads(),
        help="torch intra-op threads; on a CPU other processes share, 1 gives steadier numbers",
    )
    parser.add_argument("--out", type=Path, help="also write the markdown here")
    args = parser.parse_args(argv)
    args.dtype = "float32"  # what machine_description reports
    return args


def is_steered(index: int, fraction: float) -> bool:
    """Spreads the steered rows evenly over the requests: every other one at 50 %."""
    return int((index + 1) * fraction) > int(index * fraction)


def run_mix(engine: ContinuousEngine, requests: list[BenchRequest], fraction: float, steering: SteeringSpec) -> Run:
    remaining = threading.Semaphore(0)
    errors: list[str] = []

    def on_output(output: EngineOutput) -> None:
        if output.is_finished:
            if output.error is not None:
                errors.append(output.error)
            remaining.release()

    started = time.perf_counter()
    for index, request in enumerate(requests):
        sampling = SamplingParams(max_tokens=request.num_output_tokens, temperature=0.0, ignore_eos=True)
        spec = steering if is_steered(index, fraction) else None
        request_id = f"{request.request_id}-{fraction}"
        engine.submit(EngineRequest(request_id, request.prompt_token_ids, sampling, steering=spec), on_output)
    for _ in requests:
        if not remaining.acquire(timeout=TIMEOUT_S):
            raise RuntimeError(f"the {fraction:.0%} mix did not finish within {TIMEOUT_S:.0f}s")
    if errors:
        raise RuntimeError(f"the engine failed a request: {errors[0]}")
    return Run(fraction, time.perf_counter() - started, sum(request.num_output_tokens for request in requests))


def format_table(runs: list[Run], num_requests: int) -> str:
    lines = [
        "| steered rows | requests | output tokens | median s | output tok/s | x unsteered |",
        "|---|---|---|---|---|---|",
    ]
    throughput = {}
    for fraction in STEERED_FRACTIONS:
        mine = [run for run in runs if run.fraction == fraction]
        seconds = statistics.median(run.seconds for run in mine)
        throughput[fraction] = mine[0].num_tokens / seconds
        ratio = throughput[fraction] / throughput[STEERED_FRACTIONS[0]]
        lines.append(
            f"| {fraction:.0%} | {num_requests} | {mine[0].num_tokens} | {seconds:.2f} | "
            f"{throughput[fraction]:.1f} | {ratio:.2f}x |"
        )
    return "\n".join(lines)


def run_benchmark(args: argparse.Namespace, argv: list[str]) -> str:
    torch.set_num_threads(args.threads)
    num_seqs = max(Config.max_num_seqs, args.num_requests)
    # The prefix cache (repeated prompts) and speculation (unsteered greedy rows only) would be measured as if they
    # were steering's cost; both are off, so the runs differ only in the steering hooks.
    config = Config(
        model=args.model,
        device="cpu",
        dtype="float32",
        sae_root=args.sae_root,
        max_num_seqs=num_seqs,
        enable_prefix_caching=False,
        speculative_method="none",
        cpu_threads=args.threads,
    )
    runner = ModelRunner(config)
    spec = WorkloadSpec(args.num_requests, tuple(args.prompt_len), tuple(args.output_len), args.seed)
    vocab_size = runner.model.config.vocab_size
    requests = make_workload("steer", spec, vocab_size, special_token_ids(runner.model), poisson_rate_per_s=None)
    steering = SteeringSpec(args.sae_id, (SteeringFeature(args.feature, args.strength),))
    engine = ContinuousEngine(runner, config)
    engine.start()
    try:
        run_mix(engine, requests[:2], 1.0, steering)  # warm-up, and the SAE loaded before anything is timed
        runs = []
        for round_index in range(args.repeats):
            for fraction in STEERED_FRACTIONS:
                runs.append(run_mix(engine, requests, fraction, steering))
                logger.info("round %d, %.0f%% steered: %.2fs", round_index, fraction * 100, runs[-1].seconds)
    finally:
        engine.stop()
    return "\n\n".join(
        [
            f"Machine: {machine_description(args)}",
            f"Command: `.venv/bin/python -m bench.features.steering_cost {shlex.join(argv)}`",
            f"Workload: {args.num_requests} requests at t=0, prompts {args.prompt_len[0]}-{args.prompt_len[1]} tokens, "
            f"outputs {args.output_len[0]}-{args.output_len[1]} tokens, seed {args.seed}; steered rows add feature "
            f"{args.feature} of {args.sae_id} at strength {args.strength:g}; median of {args.repeats} interleaved runs",
            format_table(runs, args.num_requests),
        ]
    )


def main(argv: list[str] | None = None) -> int:
    return run_markdown_bench(parse_args, run_benchmark, argv)


if __name__ == "__main__":
    raise SystemExit(main())
