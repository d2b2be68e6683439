"""Batch API throughput: a batch job of N prompts through the whole stack (api, SQL ledger, bulk queue,
worker, engine) against the engine alone on the same prompts, in one run.

    .venv/bin/python -m bench.service.batch_throughput [--model models/tiny] [--num-prompts 256] [--prompt-len 16,64]
        [--output-len 32,32] [--seed 0]

The engine alone: every prompt submitted at once to a `ContinuousEngine` in this process, timed from the first
submit to the last token. The batch: the same prompts as `/v1/completions` lines, timed from uploading the input
file to the batch's `completed` status (validation, dispatch, SQL writes and the output file included), on a stack
started once. The two alternate `--repeats` times, never together, so they do not share the CPU or GPU, and
drifting load hits both alike; each repeat runs prompts of its own (seed + repeat) through both. The verdict is the
median ratio. Settings (MAX_NUM_SEQS, BATCH_CHUNK_SIZE, ...) come from the environment, as for the service. The
target: the batch at >= 80 % of the engine's tokens per second.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import threading
import time

from bench.service.batch_stack import (
    bench_config,
    client_for,
    completion_lines,
    create_batch,
    random_prompts,
    running_stack,
    wait_for_end,
)
from bench.workload import BenchRequest, WorkloadSpec
from scripts.stack import Stack
from tasks.config import Config
from tasks.messages.generation import SamplingParams
from worker.engine.continuous_engine import ContinuousEngine
from worker.engine.interface import BULK_PRIORITY, EngineOutput, EngineRequest
from worker.engine.model_runner import ModelRunner

logger = logging.getLogger("bench.service.batch_throughput")
TARGET_RATIO = 0.8


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=Config().model)
    parser.add_argument("--database-url", help="an empty database (default: a fresh SQLite file)")
    parser.add_argument("--num-prompts", type=int, default=256)
    parser.add_argument("--prompt-len", default="16,64", help="min,max prompt tokens")
    parser.add_argument("--output-len", default="32,32", help="min,max output tokens")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=3)
    return parser.parse_args(argv)


def engine_alone(config: Config, requests: list[BenchRequest]) -> tuple[int, float]:
    """Output tokens and seconds with every prompt submitted to the engine at once."""
    engine = ContinuousEngine(ModelRunner(config), config)
    engine.start()
    num_tokens = 0
    remaining = len(requests)
    lock, done = threading.Lock(), threading.Event()

    def on_output(output: EngineOutput) -> None:
        nonlocal num_tokens, remaining
        with lock:
            num_tokens += len(output.new_token_ids)
            remaining -= int(output.is_finished)
            if remaining == 0:
                done.set()

    start = time.perf_counter()
    for request in requests:
        sampling = SamplingParams(max_tokens=request.num_output_tokens, temperature=0.0, ignore_eos=True)
        engine.submit(EngineRequest(request.request_id, request.prompt_token_ids, sampling, BULK_PRIORITY), on_output)
    done.wait()
    elapsed = time.perf_counter() - start
    engine.stop()
    return num_tokens, elapsed


def through_the_batch_api(stack: Stack, requests: list[BenchRequest]) -> tuple[int, float]:
    """Output tokens and seconds from the input file's upload to `completed`."""
    start = time.perf_counter()
    batch = wait_for_end(stack, create_batch(stack, completion_lines(stack.config, requests)).id)
    elapsed = time.perf_counter() - start
    if batch.status != "completed" or batch.request_counts.failed:  # type: ignore[union-attr]
        raise RuntimeError(f"the batch ended {batch.status}: {batch.request_counts}")
    output = client_for(stack).files.content(batch.output_file_id).content  # type: ignore[arg-type]
    num_tokens = sum(json.loads(line)["response"]["body"]["usage"]["completion_tokens"] for line in output.splitlines())
    return num_tokens, elapsed


def format_table(config: Config, rows: list[tuple[int, tuple[int, float], tuple[int, float]]]) -> str:
    lines = [
        "| run | engine alone: tokens, s, tokens/s | Batch API: tokens, s, tokens/s | Batch API / engine |",
        "|---|---:|---:|---:|",
    ]
    ratios = []
    for run, alone, batch in rows:
        ratios.append((batch[0] / batch[1]) / (alone[0] / alone[1]))
        lines.append(f"| {run} | {_cell(alone)} | {_cell(batch)} | {ratios[-1]:.0%} |")
    lines.append(f"| median | | | {statistics.median(ratios):.0%} |")
    settings = (
        f"max_num_seqs={config.max_num_seqs}, batch_chunk_size={config.batch_chunk_size}, "
        f"batch_chunks_in_flight={config.batch_chunks_in_flight}, device={config.device}"
    )
    return "\n".join([*lines, "", settings])


def _cell(result: tuple[int, float]) -> str:
    return f"{result[0]}, {result[1]:.2f}, {result[0] / result[1]:.0f}"


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args = parse_args(argv)
    config = bench_config(args.model, args.database_url)
    prompt_len, output_len = (tuple(int(n) for n in value.split(",")) for value in (args.prompt_len, args.output_len))

    def prompts(seed: int) -> list[BenchRequest]:
        return random_prompts(config, WorkloadSpec(args.num_prompts, prompt_len, output_len, seed))  # type: ignore[arg-type]

    rows = []
    with running_stack(config) as stack:
        warm_up = prompts(args.seed)[:2]
        engine_alone(config, warm_up)
        through_the_batch_api(stack, warm_up)  # first forward passes, connections
        for run in range(1, args.repeats + 1):  # alternating, so drifting machine load hits both alike
            # New prompts each run: the stack's engine keeps its prefix cache from batch to batch, so prompts it has
            # seen would skip most of their prefill, which the fresh engine alone never can.
            requests = prompts(args.seed + run)
            alone = engine_alone(config, requests)
            batch = through_the_batch_api(stack, requests)
            logger.info("run %d: engine alone %d tokens in %.2f s, batch %d tokens in %.2f s", run, *alone, *batch)
            rows.append((run, alone, batch))
    print(format_table(config, rows))
    ratio = statistics.median((b[0] / b[1]) / (a[0] / a[1]) for _, a, b in rows)
    return 0 if ratio >= TARGET_RATIO else 1


if __name__ == "__main__":
    sys.exit(main())
