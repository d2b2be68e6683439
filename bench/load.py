"""The api under many open streams: ramps concurrent streamed completions (16 → 1,024 by default) against one real
stack on loopback and, at each step, while the streams are open, probes `/health` and times a new request's answer.

    .venv/bin/python -m bench.load [--steps 16,64,256,1024] [--output-len 64] [--step-timeout 120]

Each step opens N streams at once (short prompts, greedy, EOS ignored), each held open until its last token or the
step's timeout, and prints: how many got 200, 429 or anything else; TTFT p50/p99 of the admitted ones; `/health`
latency p50/p99 while they were open, and p99 once every stream had its answer (the api then only relays tokens
while the worker runs flat out); how long a new request waited for its answer (200 or 429); and the api
process's resident memory, total and per open stream. The probes run in a process of their own, so that the
streams' client, busy reading N streams, does not delay them. Loopback only; the stack's settings come from the
environment (MAX_NUM_SEQS, MAX_QUEUED_REQUESTS, API_CONNECTIONS ...).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import multiprocessing
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import requests

from bench.batch_stack import bench_config, running_stack
from bench.metrics import percentile
from scripts.stack import Stack

logger = logging.getLogger("bench.load")
HEALTH_PROBE_INTERVAL_S = 0.1


@dataclass
class StepResult:
    num_streams: int
    statuses: dict[str, int] = field(default_factory=dict)
    ttft_s: list[float] = field(default_factory=list)
    health_s: list[float] = field(default_factory=list)
    health_sent_at: list[float] = field(default_factory=list)  # wall clock
    all_admitted_at: float = float("inf")  # wall clock: the last stream's answer (200 or refusal) arrived
    new_request_s: float = float("nan")
    new_request_status: int = 0
    api_rss_mb: float = 0.0
    api_rss_idle_mb: float = 0.0

    def count(self, status: str) -> None:
        self.statuses[status] = self.statuses.get(status, 0) + 1


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="models/tiny")
    parser.add_argument("--steps", default="16,64,256,1024", help="comma-separated numbers of streams at once")
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--step-timeout", type=float, default=120.0, help="seconds a step may take")
    parser.add_argument("--database-url", help="an empty database (default: a fresh SQLite file)")
    args = parser.parse_args(argv)
    args.steps = [int(step) for step in args.steps.split(",")]
    return args


def api_rss_mb(stack: Stack) -> float:
    """Resident memory of the api's gunicorn master and its worker processes."""
    master = stack.process("api").popen.pid
    pids = [master, *(int(pid) for pid in Path(f"/proc/{master}/task/{master}/children").read_text().split())]
    total_kb = 0
    for pid in pids:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                total_kb += int(line.split()[1])
    return total_kb / 1024


async def one_stream(client: httpx.AsyncClient, body: dict, result: StepResult, opened: asyncio.Event) -> None:
    started = time.perf_counter()
    try:
        async with client.stream("POST", "/v1/completions", json=body) as response:
            result.count(str(response.status_code))
            result.all_admitted_at = time.time()
            if response.status_code != 200:
                return
            is_first = True
            async for line in response.aiter_lines():
                if is_first and line.startswith("data:"):
                    result.ttft_s.append(time.perf_counter() - started)
                    is_first = False
                opened.set()
    except httpx.HTTPError as exc:
        result.count(type(exc).__name__)


def probe(base_url: str, headers: dict, body: dict, ready: Any, stop: Any, results: Any) -> None:
    """In its own process: `/health` every 100 ms until `stop` is set, and one new request 2 s after it sets `ready`
    (the step's streams open then: on a loaded machine a spawned process can take a minute to import)."""
    session = requests.Session()
    start_new_at = time.time() + 2.0
    ready.set()
    health_s: list[float] = []
    sent_at: list[float] = []
    new_request = (float("nan"), 0)
    while not stop.is_set():
        if time.time() >= start_new_at and new_request[1] == 0:
            started = time.perf_counter()
            with session.post(f"{base_url}/v1/completions", json={**body, "max_tokens": 1}, headers=headers,
                              stream=True, timeout=60) as response:  # fmt: skip
                new_request = (time.perf_counter() - started, response.status_code)  # admitted (200) or refused
        started = time.perf_counter()
        sent_at.append(time.time())
        try:
            session.get(f"{base_url}/health", timeout=10)
            health_s.append(time.perf_counter() - started)
        except requests.RequestException:
            health_s.append(float("inf"))
        time.sleep(HEALTH_PROBE_INTERVAL_S)
    results.put((health_s, sent_at, new_request))


async def run_step(stack: Stack, num_streams: int, args: argparse.Namespace) -> StepResult:
    result = StepResult(num_streams, api_rss_idle_mb=api_rss_mb(stack))
    body = {
        "model": stack.config.model_name,
        "prompt": "the cat sat on the",
        "max_tokens": args.output_len,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
    }
    limits = httpx.Limits(max_connections=num_streams + 16, max_keepalive_connections=0)
    headers = {"Authorization": f"Bearer {stack.api_key}"}
    timeout = httpx.Timeout(args.step_timeout, connect=args.step_timeout)
    spawn = multiprocessing.get_context("spawn")
    ready, stop, results = spawn.Event(), spawn.Event(), spawn.Queue()
    prober = spawn.Process(target=probe, args=(stack.base_url, headers, body, ready, stop, results))
    prober.start()
    if not ready.wait(300):
        raise TimeoutError("the probe process did not start")
    async with httpx.AsyncClient(base_url=stack.base_url, headers=headers, limits=limits, timeout=timeout) as client:
        opened = asyncio.Event()
        streams = [asyncio.create_task(one_stream(client, body, result, opened)) for _ in range(num_streams)]
        await asyncio.wait_for(opened.wait(), args.step_timeout)
        await asyncio.sleep(1.0)  # every stream has had time to connect
        result.api_rss_mb = api_rss_mb(stack)
        await asyncio.wait(streams, timeout=args.step_timeout)
    stop.set()
    result.health_s, result.health_sent_at, (result.new_request_s, result.new_request_status) = results.get(timeout=60)
    prober.join(10)
    return result


def table(results: list[StepResult]) -> str:
    header = (
        "| streams | 200 | 429 | other (kind: count) | TTFT p50 s | TTFT p99 s | /health p50 ms | /health p99 ms | "
        "/health p99 ms once all admitted (probes) | new request s (status) | api RSS MB | KB per stream |"
    )
    lines = [header, "|" + "---|" * 12]
    for r in results:
        other = ", ".join(f"{status}: {n}" for status, n in sorted(r.statuses.items()) if status not in ("200", "429"))
        ttft = sorted(r.ttft_s) or [float("nan")]
        health = sorted(r.health_s) or [float("nan")]
        streaming = [s for s, at in zip(r.health_s, r.health_sent_at, strict=True) if at > r.all_admitted_at]
        streaming_p99 = percentile(sorted(streaming) or [float("nan")], 99)
        per_stream_kb = (r.api_rss_mb - r.api_rss_idle_mb) * 1024 / r.num_streams
        lines.append(
            f"| {r.num_streams} | {r.statuses.get('200', 0)} | {r.statuses.get('429', 0)} | {other or 0} | "
            f"{statistics.median(ttft):.2f} | {percentile(ttft, 99):.2f} | {statistics.median(health) * 1e3:.1f} | "
            f"{percentile(health, 99) * 1e3:.1f} | {streaming_p99 * 1e3:.1f} ({len(streaming)}) | "
            f"{r.new_request_s:.3f} ({r.new_request_status}) | "
            f"{r.api_rss_mb:.0f} | {per_stream_kb:.0f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    config = bench_config(args.model, args.database_url)
    results = []
    with running_stack(config) as stack:
        for num_streams in args.steps:
            logger.info("step: %d streams", num_streams)
            results.append(asyncio.run(run_step(stack, num_streams, args)))
    print(table(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
