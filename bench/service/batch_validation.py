"""Background validation of a batch file against a real stack: how long POST /v1/batches takes, how fast the api
validates the lines, and what /health's latency is while it does (against the same stack idle).

    .venv/bin/python -m bench.service.batch_validation --lines 20000
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time

import requests

from bench.service.batch_stack import bench_config, client_for, running_stack
from scripts.stack import Stack
from tasks.config import Config

logger = logging.getLogger(__name__)
PROBE_INTERVAL_S = 0.02


def chat_lines(model: str, num_lines: int) -> bytes:
    lines = (
        {"custom_id": f"l-{i}", "method": "POST", "url": "/v1/chat/completions",
         "body": {"model": model, "messages": [{"role": "user", "content": f"hello {i}"}], "max_tokens": 1}}
        for i in range(num_lines)
    )  # fmt: skip
    return "".join(json.dumps(line) + "\n" for line in lines).encode()


def health_latency_s(stack: Stack) -> float:
    started = time.perf_counter()
    requests.get(f"{stack.base_url}/health", timeout=10).raise_for_status()
    return time.perf_counter() - started


def percentiles_ms(samples: list[float]) -> str:
    ordered = sorted(samples)
    p50, p99 = (ordered[min(len(ordered) - 1, int(q * len(ordered)))] for q in (0.5, 0.99))
    return f"{p50 * 1000:.1f} / {p99 * 1000:.1f} / {ordered[-1] * 1000:.1f}"


def measure(stack: Stack, num_lines: int) -> None:
    client = client_for(stack)
    idle = []
    for _ in range(100):
        idle.append(health_latency_s(stack))
        time.sleep(PROBE_INTERVAL_S)
    upload = client.files.create(file=("bench.jsonl", chat_lines(stack.config.model_name, num_lines)), purpose="batch")
    started = time.perf_counter()
    batch = client.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h")
    post_s = time.perf_counter() - started
    busy = []
    while batch.status == "validating":
        busy.append(health_latency_s(stack))
        if len(busy) % 10 == 0:
            batch = client.batches.retrieve(batch.id)
        time.sleep(PROBE_INTERVAL_S)
    validation_s = time.perf_counter() - started
    client.batches.cancel(batch.id)
    print("| lines | POST /v1/batches | validated in | lines/s | /health p50 / p99 / max, idle | while validating |")
    print("|---|---|---|---|---|---|")
    print(
        f"| {num_lines} | {post_s * 1000:.0f} ms | {validation_s:.1f} s ({batch.status}) | "
        f"{num_lines / validation_s:.0f} | {percentiles_ms(idle)} ms | {percentiles_ms(busy)} ms |"
    )


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=Config().model)
    parser.add_argument("--database-url", help="an empty database (default: a fresh SQLite file)")
    parser.add_argument("--lines", type=int, default=20_000)
    args = parser.parse_args(argv)
    config = bench_config(args.model, args.database_url)
    with running_stack(config) as stack:
        measure(stack, args.lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
