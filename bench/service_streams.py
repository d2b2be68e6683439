"""Streamed completions through the service against the same engine in process: what HTTP, SSE, Redis and the
Celery worker's threads cost on top of the engine, for N clients streaming at once.

    .venv/bin/python -m bench.service_streams [--model models/tiny] [--num-requests 32] [--output-len 128]
        [--rounds 4] [--threads 1] [--database-url URL]

Each round sends the same N prompts at t=0: in process to `ContinuousEngine` (the baseline, as
bench.engine_throughput's (iv) feeds it), then as streamed `/v1/completions` through a stack of real processes
(gunicorn, a Celery worker, Redis, SQLite) with the `openai` client, one thread per request. Greedy, EOS ignored, so
every request yields exactly its output length. Prints per-round output tokens/s and TTFT, and service / engine.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from functools import partial

from openai import OpenAI

from bench.batch_stack import bench_config, client_for, random_prompts, running_stack
from bench.metrics import percentile, summarize
from bench.steerbatch_engine import SteerbatchEngine
from bench.workload import BenchRequest, WorkloadSpec
from scripts.stack import Stack
from tasks.config import Config
from worker.engine.model_runner import ModelRunner

logger = logging.getLogger("bench.service_streams")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="models/tiny")
    parser.add_argument("--num-requests", type=int, default=32)
    parser.add_argument("--prompt-len", type=int, nargs=2, default=(32, 256), metavar=("MIN", "MAX"))
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1, help="torch threads of the engine, in both runs")
    parser.add_argument("--database-url", help="an empty database (default: a fresh SQLite file)")
    return parser.parse_args(argv)


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


def service_rounds(stack: Stack, requests: list[BenchRequest], rounds: int) -> list[tuple[float, float]]:
    """(output tokens/s, TTFT p50 s) of each round through the stack, the threads sharing one client (making one
    per request costs the client process more than the service takes to answer)."""
    client, model = client_for(stack), stack.config.model_name
    with ThreadPoolExecutor(len(requests)) as pool:
        stream_one(client, model, requests[0], time.perf_counter())  # warm-up
        results = []
        for _ in range(rounds):
            start = time.perf_counter()
            outcomes = list(pool.map(partial(stream_one, client, model, start=start), requests))
            wall = time.perf_counter() - start
            tokens = sum(num_tokens for num_tokens, _ in outcomes)
            results.append((tokens / wall, percentile([ttft for _, ttft in outcomes], 50)))
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


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args = parse_args(argv)
    config = bench_config(args.model, args.database_url, max_num_seqs=args.num_requests, cpu_threads=args.threads)
    spec = WorkloadSpec(args.num_requests, tuple(args.prompt_len), (args.output_len, args.output_len), seed=0)
    requests = random_prompts(config, spec)
    engine = engine_rounds(config, requests, args.rounds)
    with running_stack(config) as stack:
        service = service_rounds(stack, requests, args.rounds)
    print(table(engine, service))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
