"""Prefix cache benchmark: our engine with the cache on and off, in one process on the same model.

Two workloads of the same shape: `shared` is 8 system prompts of ~1,000 tokens, each followed by 16 different user
turns, arriving as a Poisson stream (TTFT is what the cache is for); `unshared` has the same lengths with every
prompt distinct, all at t=0, so nothing can hit and only the cache's overhead shows in the throughput. Each pair of
runs alternates cache on and off, `--repeats` times, and the table gives the medians.

    .venv/bin/python -m bench.features.prefix_cache --model models/tiny [--threads N] [--repeats 3] [--rate 8]
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import random
import statistics

import torch

from bench.engine_throughput import machine_description
from bench.engines.steerbatch_engine import SteerbatchEngine
from bench.metrics import Summary, summarize
from bench.workload import BenchRequest, poisson_arrivals
from tasks.config import Config
from tasks.logs import configure_logging
from worker.engine.model_runner import ModelRunner

logger = logging.getLogger(__name__)


def parse_args(argv: list[str] | None, description: str | None = __doc__) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="models/tiny")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--num-systems", type=int, default=8)
    parser.add_argument("--turns", type=int, default=16, help="user turns per system prompt")
    parser.add_argument("--system-len", type=int, default=1000)
    parser.add_argument("--output-len", type=int, default=16)
    parser.add_argument("--rate", type=float, default=8.0, help="shared workload: mean arrivals per second")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dtype", default="float32")
    return parser.parse_args(argv)


def workloads(args: argparse.Namespace, vocab_size: int) -> dict[str, list[BenchRequest]]:
    rng = random.Random(args.seed)

    def tokens(num: int) -> list[int]:
        return [rng.randrange(5, vocab_size) for _ in range(num)]

    systems = [tokens(args.system_len) for _ in range(args.num_systems)]
    prompts = [[*system, *tokens(rng.randint(20, 60))] for system in systems for _ in range(args.turns)]
    rng.shuffle(prompts)
    arrivals = poisson_arrivals(len(prompts), args.rate, args.seed + 1)
    shared = [BenchRequest(f"shared-{i}", p, args.output_len, arrivals[i]) for i, p in enumerate(prompts)]
    unshared = [BenchRequest(f"unshared-{i}", tokens(len(p)), args.output_len, 0.0) for i, p in enumerate(prompts)]
    return {"shared": shared, "unshared": unshared}


def run_once(runner: ModelRunner, config: Config, workload: str, requests: list[BenchRequest]) -> Summary:
    """A fresh engine, so every run starts with an empty cache."""
    engine = SteerbatchEngine(runner, config)
    try:
        result = engine.run(workload, requests)
    finally:
        engine.close()
    return summarize(result, None)


def median_of(summaries: list[Summary], field: str) -> float:
    return statistics.median(getattr(summary, field) for summary in summaries)


def cache_on_and_off(args: argparse.Namespace) -> tuple[ModelRunner, dict[str, Config]]:
    """The runner, and the engine configs with the prefix cache on and off, for `args`."""
    configure_logging(Config())
    torch.set_num_threads(args.threads)
    config = Config(model=args.model, device="cpu", dtype=args.dtype, max_num_seqs=32, cpu_threads=args.threads)
    configs = {"cache on": config, "cache off": dataclasses.replace(config, enable_prefix_caching=False)}
    return ModelRunner(config), configs


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    runner, configs = cache_on_and_off(args)
    config = configs["cache on"]
    requests = workloads(args, runner.model.config.vocab_size)
    run_once(runner, config, "warm-up", requests["unshared"][:4])
    results: dict[tuple[str, str], list[Summary]] = {}
    for repeat in range(args.repeats):
        for workload, workload_requests in requests.items():
            for name, engine_config in configs.items():
                summary = run_once(runner, engine_config, workload, workload_requests)
                logger.info("repeat %d %s %s: %.2fs", repeat, workload, name, summary.wall_s)
                results.setdefault((workload, name), []).append(summary)
    print(report(args, machine_description(args), results))
    return 0


def report(args: argparse.Namespace, machine: str, results: dict[tuple[str, str], list[Summary]]) -> str:
    lines = [
        f"Machine: {machine}",
        "",
        f"Workload: {args.num_systems} system prompts of {args.system_len} tokens x {args.turns} user turns of 20-60 "
        f"tokens, {args.output_len} output tokens each; shared: Poisson at {args.rate}/s; unshared: all at t=0; "
        f"medians of {args.repeats} alternating runs",
        "",
        "| workload | engine | output tok/s | TTFT p50 ms | TTFT p99 ms | ITL p50 ms |",
        "|---|---|---|---|---|---|",
    ]
    for (workload, name), summaries in results.items():
        lines.append(
            f"| {workload} | {name} | {median_of(summaries, 'tokens_per_s'):.1f} | "
            f"{median_of(summaries, 'ttft_p50_ms'):.0f} | {median_of(summaries, 'ttft_p99_ms'):.0f} | "
            f"{median_of(summaries, 'itl_p50_ms'):.1f} |"
        )
    ttft_ratio = median_of(results["shared", "cache on"], "ttft_p50_ms") / median_of(
        results["shared", "cache off"], "ttft_p50_ms"
    )
    throughput_ratio = median_of(results["unshared", "cache on"], "tokens_per_s") / median_of(
        results["unshared", "cache off"], "tokens_per_s"
    )
    lines += [
        "",
        f"shared TTFT p50, cache on / off: {ttft_ratio:.3f} (target <= 0.25)",
        f"unshared throughput, cache on / off: {throughput_ratio:.3f} (target >= 0.97)",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
