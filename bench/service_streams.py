"""Streamed completions through the service against the same engine in process: what HTTP, SSE, Redis and the
Celery worker's threads cost on top of the engine, for N clients streaming at once.

    .venv/bin/python -m bench.service_streams [--model models/tiny] [--num-requests 32] [--output-len 128]
        [--rounds 4] [--threads 1] [--database-url URL]
    .venv/bin/python -m bench.service_streams --concurrency-levels 1,4,16,32,64 [--rounds 3] [--json load.json]

Each round sends the same N prompts at t=0: in process to `ContinuousEngine` (the baseline, as
bench.engine_throughput's (iv) feeds it), then as streamed `/v1/completions` through a stack of real processes
(gunicorn, a Celery worker, Redis, SQLite) with the `openai` client, one thread per request. Greedy, EOS ignored, so
every request yields exactly its output length. Prints per-round output tokens/s and TTFT, and service / engine.

With --concurrency-levels the service is measured under load instead, with no in-process baseline: one stack with
the environment's settings (MAX_NUM_SEQS, WORKER_CONCURRENCY, API_CONNECTIONS), and for each level, rounds of that many
streams sent at once, each round with prompts of its own (so no round is served from the prefix cache). Prints, per
level, the median round's output tokens/s, TTFT p50 and TTFT p99.
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import shlex
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path

import torch
from openai import OpenAI

from bench.batch_stack import bench_config, client_for, random_prompts, running_stack
from bench.engine_throughput import cpu_description
from bench.metrics import percentile, summarize
from bench.steerbatch_engine import SteerbatchEngine
from bench.workload import BenchRequest, WorkloadSpec
from scripts.stack import Stack
from tasks.config import Config
from worker.engine.model_runner import ModelRunner

logger = logging.getLogger("bench.service_streams")
ADMISSION_RETRIES = 4


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="models/tiny")
    parser.add_argument("--num-requests", type=int, default=32)
    parser.add_argument("--prompt-len", type=int, nargs=2, default=(32, 256), metavar=("MIN", "MAX"))
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1, help="torch threads of the engine, in both runs")
    parser.add_argument("--database-url", help="an empty database (default: a fresh SQLite file)")
    parser.add_argument(
        "--concurrency-levels",
        type=levels_arg,
        help="comma-separated numbers of streams at once, e.g. 1,4,16,32,64: TTFT and throughput through the service "
        "at each, instead of the comparison with the engine in process (--num-requests is then unused)",
    )
    parser.add_argument("--out", type=Path, help="also write the table here (markdown)")
    parser.add_argument("--json", type=Path, help="with --concurrency-levels: also write every round's numbers here")
    args = parser.parse_args(argv)
    if args.json is not None and args.concurrency_levels is None:
        parser.error("--json needs --concurrency-levels")
    return args


def levels_arg(value: str) -> list[int]:
    try:
        levels = [int(part) for part in value.split(",")]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of integers: {value!r}") from exc
    if not levels or min(levels) < 1:
        raise argparse.ArgumentTypeError("every level must be at least 1")
    return levels


@dataclass(frozen=True)
class LoadRound:
    tokens_per_s: float
    ttft_p50_ms: float
    ttft_p99_ms: float

    @classmethod
    def median(cls, rounds: list[LoadRound]) -> LoadRound:
        """Each number's median over the rounds (not necessarily one round's numbers)."""
        return cls(
            statistics.median(r.tokens_per_s for r in rounds),
            statistics.median(r.ttft_p50_ms for r in rounds),
            statistics.median(r.ttft_p99_ms for r in rounds),
        )


def engine_rounds(config: Config, requests: list[BenchRequest], rounds: int) -> list[tuple[float, float]]:
    """(output tokens/s, TTFT p50 s) of each round, the engine fed in this process."""
    engine = SteerbatchEngine(ModelRunner(config), config)
    try:
        engine.run("warm-up", requests[:2])
        summaries = [summarize(engine.run(f"round {i}", requests), None) for i in range(rounds)]
    finally:
        engine.close()
    return [(summary.tokens_per_s, summary.ttft_p50_ms / 1e3) for summary in summaries]


def stream_one(client: OpenAI, model: str, request: BenchRequest, start: float) -> tuple[int, float]:
    """(completion tokens, seconds from `start` to the first text) of one streamed completion."""
    stream = client.completions.create(
        model=model,
        prompt=request.prompt_token_ids,
        max_tokens=request.num_output_tokens,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    first_text_at, num_tokens = None, 0
    for chunk in stream:
        if first_text_at is None and chunk.choices and chunk.choices[0].text:
            first_text_at = time.perf_counter() - start
        if chunk.usage is not None:
            num_tokens = chunk.usage.completion_tokens
    if first_text_at is None or num_tokens != request.num_output_tokens:
        raise RuntimeError(f"{request.request_id}: {num_tokens} tokens, expected {request.num_output_tokens}")
    return num_tokens, first_text_at


def stream_round(
    pool: ThreadPoolExecutor, client: OpenAI, model: str, requests: list[BenchRequest]
) -> tuple[float, list[float]]:
    """(output tokens/s, each request's TTFT in s) of one round: every request streamed at once."""
    start = time.perf_counter()
    outcomes = list(pool.map(partial(stream_one, client, model, start=start), requests))
    wall = time.perf_counter() - start
    return sum(num_tokens for num_tokens, _ in outcomes) / wall, [ttft for _, ttft in outcomes]


def service_rounds(stack: Stack, requests: list[BenchRequest], rounds: int) -> list[tuple[float, float]]:
    """(output tokens/s, TTFT p50 s) of each round through the stack, the threads sharing one client (making one
    per request costs the client process more than the service takes to answer). The client retries a 429 as the
    `openai` client does by default, after the retry hint the admission gate sends: a burst of streams wider than the
    gate's slots is admitted that way, and the wait counts in its first token's time."""
    client, model = client_for(stack).with_options(max_retries=ADMISSION_RETRIES), stack.config.model_name
    with ThreadPoolExecutor(len(requests)) as pool:
        stream_one(client, model, requests[0], time.perf_counter())  # warm-up
        results = []
        for _ in range(rounds):
            rate, ttfts = stream_round(pool, client, model, requests)
            results.append((rate, percentile(ttfts, 50)))
    return results


def load_rounds(stack: Stack, args: argparse.Namespace) -> dict[int, list[LoadRound]]:
    """Each level's rounds through one stack, every round on prompts of its own (seeds 1, 2, ...)."""
    client, model, config = client_for(stack), stack.config.model_name, stack.config
    seeds = itertools.count(1)

    def prompts(num_requests: int) -> list[BenchRequest]:
        lengths = tuple(args.prompt_len), (args.output_len, args.output_len)
        return random_prompts(config, WorkloadSpec(num_requests, *lengths, seed=next(seeds)))

    results = {}
    with ThreadPoolExecutor(max(args.concurrency_levels)) as pool:
        stream_one(client, model, prompts(1)[0], time.perf_counter())  # warm-up
        for level in args.concurrency_levels:
            results[level] = []
            for _ in range(args.rounds):
                rate, ttfts = stream_round(pool, client, model, prompts(level))
                results[level].append(LoadRound(rate, percentile(ttfts, 50) * 1e3, percentile(ttfts, 99) * 1e3))
            logger.info("%d streams at once: %s", level, results[level])
    return results


def table(engine: list[tuple[float, float]], service: list[tuple[float, float]]) -> str:
    lines = ["| | output tok/s per round | median | TTFT p50 ms (median round) |", "|---|---|---:|---:|"]
    for label, rounds in (("engine in process", engine), ("through the service", service)):
        rates = ", ".join(f"{rate:.0f}" for rate, _ in rounds)
        ttft = statistics.median(ttft for _, ttft in rounds) * 1e3
        lines.append(f"| {label} | {rates} | {statistics.median(r for r, _ in rounds):.0f} | {ttft:.0f} |")
    ratio = statistics.median(r for r, _ in service) / statistics.median(r for r, _ in engine)
    lines.append(f"\nservice / engine, median rounds: {ratio:.2f}x")
    return "\n".join(lines)


def load_table(results: dict[int, list[LoadRound]]) -> str:
    lines = [
        "| streams at once | rounds | output tok/s | TTFT p50 ms | TTFT p99 ms |",
        "|---:|---:|---:|---:|---:|",
    ]
    for level, rounds in results.items():
        median = LoadRound.median(rounds)
        cells = (level, len(rounds), median.tokens_per_s, median.ttft_p50_ms, median.ttft_p99_ms)
        lines.append("| " + " | ".join(f"{cell:.0f}" for cell in cells) + " |")
    lines.append("\nEach cell: the median of the level's rounds.")
    return "\n".join(lines)


def load_report(args: argparse.Namespace, argv: list[str], config: Config, results: dict[int, list[LoadRound]]) -> dict:
    return {
        "command": f".venv/bin/python -m bench.service_streams {shlex.join(argv)}",
        "machine": f"{cpu_description()}; torch {torch.__version__}, worker torch threads {config.cpu_threads}",
        "settings": {
            "max_num_seqs": config.max_num_seqs,
            "worker_concurrency": config.worker_concurrency,
            "api_connections": config.api_connections,
            "prompt_len": list(args.prompt_len),
            "output_len": args.output_len,
        },
        "levels": [
            {"streams": level, "median": asdict(LoadRound.median(rounds)), "rounds": [asdict(r) for r in rounds]}
            for level, rounds in results.items()
        ],
    }


def run_load(args: argparse.Namespace, argv: list[str]) -> None:
    config = bench_config(args.model, args.database_url, cpu_threads=args.threads)
    with running_stack(config) as stack:
        results = load_rounds(stack, args)
    print(load_table(results))
    if args.json is not None:
        args.json.write_text(json.dumps(load_report(args, argv, config, results), indent=2) + "\n")


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.concurrency_levels is not None:
        run_load(args, argv)
        return 0
    config = bench_config(args.model, args.database_url, max_num_seqs=args.num_requests, cpu_threads=args.threads)
    spec = WorkloadSpec(args.num_requests, tuple(args.prompt_len), (args.output_len, args.output_len), seed=0)
    requests = random_prompts(config, spec)
    engine = engine_rounds(config, requests, args.rounds)
    with running_stack(config) as stack:
        service = service_rounds(stack, requests, args.rounds)
    report = table(engine, service)
    print(report)
    if args.out is not None:
        args.out.write_text(report + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
