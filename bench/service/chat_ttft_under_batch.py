"""Chat time to first token while a large batch runs: idle, then with a batch of N lines in progress,
on one stack of real processes.

    .venv/bin/python -m bench.service.chat_ttft_under_batch [--model models/tiny] [--num-chats 20] [--batch-lines 10000]
        [--batch-output-len 64] [--chat-max-tokens 8]

TTFT is measured the way a chat client sees it: from sending a streamed `/v1/chat/completions` to the first chunk
that carries text. The chats go one after another, idle first, then while the batch is in progress (the batch is
cancelled at the end). The target: loaded TTFT <= 2 x idle TTFT, at the median and at p90.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import time

from bench.service.batch_stack import (
    bench_config,
    client_for,
    completion_lines,
    create_batch,
    random_prompts,
    running_stack,
)
from bench.workload import WorkloadSpec
from scripts.stack import Stack
from tasks.config import Config

logger = logging.getLogger("bench.service.chat_ttft_under_batch")
TARGET_RATIO = 2.0
MIN_RUNNING_S = 2.0  # the batch has filled the engine before loaded chats start


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=Config().model)
    parser.add_argument("--database-url", help="an empty database (default: a fresh SQLite file)")
    parser.add_argument("--num-chats", type=int, default=20)
    parser.add_argument("--batch-lines", type=int, default=10_000)
    parser.add_argument("--batch-output-len", type=int, default=64)
    parser.add_argument("--chat-max-tokens", type=int, default=8)
    return parser.parse_args(argv)


def chat_ttft(stack: Stack, max_tokens: int) -> float:
    messages = [{"role": "user", "content": "tell me about cats"}]
    start = time.perf_counter()
    stream = client_for(stack).chat.completions.create(
        model=stack.config.model_name,
        messages=messages,
        max_tokens=max_tokens,
        stream=True,  # type: ignore[arg-type]
    )
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            ttft = time.perf_counter() - start
            stream.close()
            return ttft
    raise RuntimeError("the chat produced no text")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def measure(stack: Stack, args: argparse.Namespace) -> tuple[list[float], list[float], str]:
    idle = [chat_ttft(stack, args.chat_max_tokens) for _ in range(args.num_chats)]
    spec = WorkloadSpec(args.batch_lines, (16, 64), (args.batch_output_len, args.batch_output_len), seed=0)
    start = time.perf_counter()
    batch = create_batch(stack, completion_lines(stack.config, random_prompts(stack.config, spec)))
    client = client_for(stack)
    while batch.status == "validating":  # the api validates the file in the background
        time.sleep(0.1)
        batch = client.batches.retrieve(batch.id)
    logger.info("batch %s of %d lines validated in %.1f s", batch.id, args.batch_lines, time.perf_counter() - start)
    time.sleep(MIN_RUNNING_S)
    loaded = [chat_ttft(stack, args.chat_max_tokens) for _ in range(args.num_chats)]
    during = client.batches.retrieve(batch.id)
    if during.status != "in_progress":
        logger.warning("the batch ended (%s) before the loaded chats did: make it larger", during.status)
    client.batches.cancel(batch.id)
    return idle, loaded, f"{during.status}, {during.request_counts}"


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args = parse_args(argv)
    config = bench_config(args.model, args.database_url)
    with running_stack(config) as stack:
        chat_ttft(stack, args.chat_max_tokens)  # warm-up
        idle, loaded, batch_state = measure(stack, args)
    rows = [("idle", idle), (f"with a {args.batch_lines}-line batch running", loaded)]
    print("| chat TTFT | median ms | p90 ms |\n|---|---:|---:|")
    for label, values in rows:
        print(f"| {label} | {statistics.median(values) * 1000:.1f} | {percentile(values, 0.9) * 1000:.1f} |")
    ratio = statistics.median(loaded) / statistics.median(idle)
    print(f"\nloaded / idle median: {ratio:.2f}x; batch when the loaded chats ended: {batch_state}")
    print(
        f"max_num_seqs={config.max_num_seqs}, worker_concurrency={config.worker_threads}, "
        f"batch_chunk_size={config.batch_chunk_size}, batch_chunks_in_flight={config.batch_chunks_in_flight}"
    )
    return 0 if ratio <= TARGET_RATIO else 1


if __name__ == "__main__":
    sys.exit(main())
