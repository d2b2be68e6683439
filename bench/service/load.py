"""The api under many open streams: ramps concurrent streamed completions (16 → 1,024 by default) against one real
stack on loopback and, at each step, probes `/health` and times a new request's answer, both while the streams are
being admitted (the burst) and once all of them are open (holding).

    .venv/bin/python -m bench.service.load [--steps 16,64,256,1024] [--output-len 64] [--step-timeout 120]

Each step sends N streams at once (short prompts, greedy, EOS ignored), each held open until its last token or the
step's timeout. A 429 is retried after its `retry-after-ms` (else Retry-After), as the `openai` client does (the api
refuses the part of a burst it cannot admit within ADMISSION_WAIT_S). It prints: how many streams ended with 200 or
anything else and how many 429s were retried; TTFT p50/p99 from the first attempt; `/health` latency p50/p99 during
the burst and p99 while holding (the api then only relays tokens while the worker runs flat out); how long new
requests waited for their answer (200 or 429), sent every 0.25 s during the burst and once while holding; the api's
resident memory, total and per open stream. The probes run in a process of their own, so that the streams' client,
busy reading N streams, does not delay them. Loopback only; the stack's settings come from the environment
(MAX_NUM_SEQS, ADMISSION_SLOTS, ADMISSION_WAIT_S, MAX_QUEUED_REQUESTS, API_CONNECTIONS ...).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import multiprocessing
import statistics
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import requests

from bench.metrics import percentile
from bench.service.batch_stack import bench_config, running_stack
from scripts.stack import Stack

logger = logging.getLogger("bench.service.load")
HEALTH_PROBE_INTERVAL_S = 0.1
NEW_REQUEST_INTERVAL_S = 0.25


@dataclass
class StepResult:
    num_streams: int
    statuses: dict[str, int] = field(default_factory=dict)
    ttft_s: list[float] = field(default_factory=list)
    health_s: list[float] = field(default_factory=list)
    health_sent_at: list[float] = field(default_factory=list)  # wall clock
    num_retried: int = 0  # 429s answered and retried
    all_admitted_at: float = float("inf")  # wall clock: the last stream's final answer (200 or other) arrived
    # new requests sent every NEW_REQUEST_INTERVAL_S during the burst: (seconds to its answer, status) each
    new_requests: list[tuple[float, int]] = field(default_factory=list)
    new_request_holding: tuple[float, int] = (float("nan"), 0)  # one once every stream was admitted
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


async def one_stream(
    client: httpx.AsyncClient, body: dict, result: StepResult, opened: asyncio.Event, deadline: float
) -> None:
    started = time.perf_counter()
    try:
        while True:
            async with client.stream("POST", "/v1/completions", json=body) as response:
                if response.status_code == 429 and time.monotonic() < deadline:
                    result.num_retried += 1
                    retry_after_s = retry_after_of(response)
                else:
                    result.count(str(response.status_code))
                    result.all_admitted_at = time.time()
                    if response.status_code == 200:
                        await read_stream(response, result, started, opened)
                    return
            await asyncio.sleep(retry_after_s)
    except httpx.HTTPError as exc:
        result.count(type(exc).__name__)


def retry_after_of(response: httpx.Response) -> float:
    """Seconds to wait before retrying, read as the `openai` client reads them: `retry-after-ms` first."""
    if "retry-after-ms" in response.headers:
        return float(response.headers["retry-after-ms"]) / 1000
    return float(response.headers.get("Retry-After", "1"))


async def read_stream(response: httpx.Response, result: StepResult, started: float, opened: asyncio.Event) -> None:
    is_first = True
    async for line in response.aiter_lines():
        if is_first and line.startswith("data:"):
            result.ttft_s.append(time.perf_counter() - started)
            is_first = False
        opened.set()


def timed_new_request(session: requests.Session, base_url: str, headers: dict, body: dict) -> tuple[float, int]:
    """Seconds until a new streamed request's answer (its headers: admitted or refused), and its status."""
    started = time.perf_counter()
    with session.post(f"{base_url}/v1/completions", json={**body, "max_tokens": 1}, headers=headers, stream=True,
                      timeout=60) as response:  # fmt: skip
        return time.perf_counter() - started, response.status_code


def probe(base_url: str, headers: dict, body: dict, ready: Any, admitted: Any, stop: Any, results: Any) -> None:
    """In its own process: `/health` every 100 ms until `stop` is set; on a thread beside it, a new request every
    NEW_REQUEST_INTERVAL_S until `admitted` is set (the burst), then one more (holding). The streams are sent once
    this sets `ready` (on a loaded machine a spawned process can take a minute to import)."""
    new_requests: list[tuple[float, int]] = []
    holding: list[tuple[float, int]] = []

    def send_new_requests() -> None:
        session = requests.Session()
        while not admitted.wait(NEW_REQUEST_INTERVAL_S):
            new_requests.append(timed_new_request(session, base_url, headers, body))
        holding.append(timed_new_request(session, base_url, headers, body))

    sender = threading.Thread(target=send_new_requests, daemon=True)
    session = requests.Session()
    health_s: list[float] = []
    sent_at: list[float] = []
    ready.set()
    sender.start()
    while not stop.is_set():
        started = time.perf_counter()
        sent_at.append(time.time())
        try:
            session.get(f"{base_url}/health", timeout=10)
            health_s.append(time.perf_counter() - started)
        except requests.RequestException:
            health_s.append(float("inf"))
        time.sleep(HEALTH_PROBE_INTERVAL_S)
    sender.join(60)
    results.put((health_s, sent_at, new_requests, holding[0] if holding else (float("nan"), 0)))


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
    ready, admitted, stop, results = spawn.Event(), spawn.Event(), spawn.Event(), spawn.Queue()
    prober = spawn.Process(target=probe, args=(stack.base_url, headers, body, ready, admitted, stop, results))
    prober.start()
    if not ready.wait(300):
        raise TimeoutError("the probe process did not start")
    deadline = time.monotonic() + args.step_timeout
    async with httpx.AsyncClient(base_url=stack.base_url, headers=headers, limits=limits, timeout=timeout) as client:
        opened = asyncio.Event()
        streams = [asyncio.create_task(one_stream(client, body, result, opened, deadline)) for _ in range(num_streams)]
        await asyncio.wait_for(opened.wait(), args.step_timeout)
        while sum(result.statuses.values()) < num_streams and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        admitted.set()
        result.api_rss_mb = api_rss_mb(stack)
        await asyncio.wait(streams, timeout=max(deadline - time.monotonic(), 1.0))
    stop.set()
    result.health_s, result.health_sent_at, result.new_requests, result.new_request_holding = results.get(timeout=60)
    prober.join(10)
    return result


def new_requests_cell(new_requests: list[tuple[float, int]]) -> str:
    if not new_requests:
        return "(none sent)"
    seconds = sorted(s for s, _ in new_requests)
    statuses = Counter(status for _, status in new_requests)
    counts = ", ".join(f"{status}: {n}" for status, n in sorted(statuses.items()))
    return f"{statistics.median(seconds):.3f}, {seconds[-1]:.3f} ({counts})"


def table(results: list[StepResult]) -> str:
    header = (
        "| streams | 200 | other (kind: count) | 429s retried | TTFT p50 s | TTFT p99 s | /health p50 ms (burst) | "
        "/health p99 ms (burst) | /health p99 ms holding (probes) | new request s during burst: p50, max (statuses) | "
        "new request s holding (status) | api RSS MB | KB per stream |"
    )
    lines = [header, "|" + "---|" * 13]
    for r in results:
        other = ", ".join(f"{status}: {n}" for status, n in sorted(r.statuses.items()) if status != "200")
        ttft = sorted(r.ttft_s) or [float("nan")]
        burst = sorted(s for s, at in zip(r.health_s, r.health_sent_at, strict=True) if at <= r.all_admitted_at)
        holding = sorted(s for s, at in zip(r.health_s, r.health_sent_at, strict=True) if at > r.all_admitted_at)
        burst = burst or [float("nan")]
        per_stream_kb = (r.api_rss_mb - r.api_rss_idle_mb) * 1024 / r.num_streams
        lines.append(
            f"| {r.num_streams} | {r.statuses.get('200', 0)} | {other or 0} | {r.num_retried} | "
            f"{statistics.median(ttft):.2f} | {percentile(ttft, 99):.2f} | {statistics.median(burst) * 1e3:.1f} | "
            f"{percentile(burst, 99) * 1e3:.1f} | {percentile(holding or [float('nan')], 99) * 1e3:.1f} "
            f"({len(holding)}) | {new_requests_cell(r.new_requests)} | "
            f"{r.new_request_holding[0]:.3f} ({r.new_request_holding[1]}) | {r.api_rss_mb:.0f} | {per_stream_kb:.0f} |"
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
