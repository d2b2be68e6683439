"""Streamed completions through the service against the same engine in process: what HTTP, SSE, Redis and the
Celery worker's threads cost on top of the engine, for N clients streaming at once.

    .venv/bin/python -m bench.service.service_streams [--model models/tiny | --random-config 135m] [--num-requests 32]
        [--output-len 128] [--rounds 4] [--threads 1] [--database-url URL]
    .venv/bin/python -m bench.service.service_streams --concurrency-levels 1,4,16,32,64 [--rounds 3] [--json load.json]

Each round sends the same N prompts at t=0: in process to `ContinuousEngine` (the baseline, as
bench.engine_throughput's (iv) feeds it), then as streamed `/v1/completions` through a stack of real processes
(gunicorn, a Celery worker, Redis, SQLite or --database-url) with a lean asyncio client
(`bench/service/sse_client.py`), and as the same streams to HF `transformers serve --continuous-batching` on the same
model folder with the same torch threads (the peer, `bench/service/hf_serve_peer.py`; skipped with one line where it is
not installed, or with --no-peer), engine, service and peer rounds alternating. Greedy, EOS ignored, so every request
yields exactly its output length; tokens are counted from usage and token ids, not text, so a random-init model
(--random-config 135m) runs too. Prints per-round output tokens/s, TTFT p50, the client's own CPU time, each service
process's CPU per output token (the worker's engine process apart from it), the engine thread's time on a CPU and
waiting for one on both sides (from /proc's schedstat), service / engine and service / peer per round.

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
import os
import shlex
import statistics
import sys
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from bench.engine_throughput import cpu_description
from bench.engines.steerbatch_engine import SteerbatchEngine
from bench.metrics import percentile, summarize
from bench.random_model import SIZES, random_model_dir
from bench.service import hf_serve_peer
from bench.service.batch_stack import bench_config, random_prompts, running_stack
from bench.service.process_cpu import (
    ThreadTimes,
    busiest_thread,
    engine_process_pid,
    stack_cpu_seconds,
    thread_times,
)
from bench.service.sse_client import RoundTiming, StreamClient
from bench.workload import BenchRequest, WorkloadSpec
from scripts.stack import Stack
from tasks.config import Config
from worker.engine.model_runner import ModelRunner

logger = logging.getLogger("bench.service.service_streams")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="models/tiny")
    parser.add_argument(
        "--random-config", choices=sorted(SIZES), help="a random-init float32 model of this size instead of --model"
    )
    parser.add_argument("--num-requests", type=int, default=32)
    parser.add_argument("--prompt-len", type=int, nargs=2, default=(32, 256), metavar=("MIN", "MAX"))
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1, help="torch threads of the engine, in both runs")
    parser.add_argument("--database-url", help="an empty database (default: a fresh SQLite file)")
    parser.add_argument("--no-peer", action="store_true", help="leave out HF `transformers serve`")
    parser.add_argument(
        "--concurrency-levels",
        type=levels_arg,
        help="comma-separated numbers of streams at once, e.g. 1,4,16,32,64: TTFT and throughput through the service "
        "at each, instead of the comparison with the engine in process (--num-requests is then unused)",
    )
    parser.add_argument("--out", type=Path, help="also write the table here (markdown)")
    parser.add_argument("--json", type=Path, help="with --concurrency-levels: also write every round's numbers here")
    args = parser.parse_args(argv)
    if args.random_config is not None:
        args.model = str(random_model_dir(args.random_config, torch.float32))
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
class Measured:
    tokens_per_s: float
    ttft_p50_ms: float
    client_cpu_s: float  # the measuring client's own CPU time over the round (0 for the engine fed in process)
    # the service's processes' CPU milliseconds per output token over the round, by process (none for the engine)
    cpu_ms_per_token: dict[str, float] = field(default_factory=dict)
    # the engine thread's time on a CPU and waiting for one over the round (None where /proc keeps no schedstat)
    engine_thread: ThreadTimes | None = None

    @classmethod
    def of(cls, timing: RoundTiming, cpu_s: dict[str, float], engine_thread: ThreadTimes | None = None) -> Measured:
        ttft_p50_ms = percentile([stream.ttft_s for stream in timing.streams], 50) * 1e3
        num_tokens = sum(stream.num_tokens for stream in timing.streams)
        per_token = {name: seconds * 1e3 / num_tokens for name, seconds in cpu_s.items()}
        return cls(timing.tokens_per_s, ttft_p50_ms, timing.client_cpu_s, per_token, engine_thread)


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


def interleaved_rounds(
    config: Config, stack: Stack, requests: list[BenchRequest], rounds: int, peer: StreamClient | None = None
) -> tuple[list[Measured], list[Measured], list[Measured]]:
    """(engine rounds, service rounds, peer rounds), alternating one of each, so that a machine shared with other work
    loads all alike: the engine fed in this process, then the same requests streamed through the stack at once, then
    to the peer server (no peer rounds without one)."""
    engine = SteerbatchEngine(ModelRunner(config), config)
    client = StreamClient(stack.base_url, stack.api_key, config.model_name)
    engine_results, service_results, peer_results = [], [], []
    worker = next(process for process in stack.processes if process.name == "worker")
    service_engine_pid = engine_process_pid(worker.popen.pid) or worker.popen.pid  # ENGINE_PROCESS=0: the worker's
    try:
        engine.run("warm-up", requests[:2])
        client.run_round(requests[:1])
        if peer is not None:
            peer.run_round(requests[:1])
        for i in range(rounds):
            threads_before = thread_times(os.getpid())
            summary = summarize(engine.run(f"round {i}", requests), None)
            engine_thread = busiest_thread(threads_before, thread_times(os.getpid()))
            engine_results.append(Measured(summary.tokens_per_s, summary.ttft_p50_ms, 0.0, {}, engine_thread))
            cpu_before, threads_before = stack_cpu_seconds(stack), thread_times(service_engine_pid)
            timing = client.run_round(requests)
            engine_thread = busiest_thread(threads_before, thread_times(service_engine_pid))
            cpu_s = {name: seconds - cpu_before[name] for name, seconds in stack_cpu_seconds(stack).items()}
            service_results.append(Measured.of(timing, cpu_s, engine_thread))
            if peer is not None:
                peer_results.append(Measured.of(peer.run_round(requests), {}))
            logger.info(
                "round %d: engine %s, service %s, peer %s",
                i,
                *(r[-1:] for r in (engine_results, service_results, peer_results)),
            )
    finally:
        engine.close()
        client.close()
    return engine_results, service_results, peer_results


def load_rounds(stack: Stack, args: argparse.Namespace) -> dict[int, list[LoadRound]]:
    """Each level's rounds through one stack, every round on prompts of its own (seeds 1, 2, ...)."""
    config = stack.config
    client = StreamClient(stack.base_url, stack.api_key, config.model_name)
    seeds = itertools.count(1)

    def prompts(num_requests: int) -> list[BenchRequest]:
        lengths = tuple(args.prompt_len), (args.output_len, args.output_len)
        return random_prompts(config, WorkloadSpec(num_requests, *lengths, seed=next(seeds)))

    results = {}
    with client:
        client.run_round(prompts(1))  # warm-up
        for level in args.concurrency_levels:
            results[level] = []
            for _ in range(args.rounds):
                timing = client.run_round(prompts(level))
                ttfts = [stream.ttft_s for stream in timing.streams]
                results[level].append(
                    LoadRound(timing.tokens_per_s, percentile(ttfts, 50) * 1e3, percentile(ttfts, 99) * 1e3)
                )
            logger.info("%d streams at once: %s", level, results[level])
    return results


def table(engine: list[Measured], service: list[Measured], peer: list[Measured]) -> str:
    lines = [
        "| | output tok/s per round | median | TTFT p50 ms per round | median | client CPU s per round |",
        "|---|---|---:|---|---:|---|",
    ]
    sides = [("engine in process", engine), ("through the service", service)]
    for label, rounds in [*sides, *([(PEER_LABEL, peer)] if peer else [])]:
        rates = ", ".join(f"{r.tokens_per_s:.0f}" for r in rounds)
        ttfts = ", ".join(f"{r.ttft_p50_ms:.1f}" for r in rounds)
        cpu = ", ".join(f"{r.client_cpu_s:.3f}" for r in rounds) if label != "engine in process" else "—"
        median_rate = statistics.median(r.tokens_per_s for r in rounds)
        median_ttft = statistics.median(r.ttft_p50_ms for r in rounds)
        lines.append(f"| {label} | {rates} | {median_rate:.0f} | {ttfts} | {median_ttft:.1f} | {cpu} |")
    for name in service[0].cpu_ms_per_token:
        costs = ", ".join(f"{r.cpu_ms_per_token[name]:.3f}" for r in service)
        median_cost = statistics.median(r.cpu_ms_per_token[name] for r in service)
        lines.append(f"| {name} CPU ms per output token | {costs} | {median_cost:.3f} | | | |")
    for where, rounds in [("in process", engine), ("in the service", service)]:
        threads = [r.engine_thread for r in rounds if r.engine_thread is not None]
        if len(threads) == len(rounds):  # no row where /proc keeps no schedstat
            lines.append(engine_thread_row(where, threads))
    ratios = [s.tokens_per_s / e.tokens_per_s for e, s in zip(engine, service, strict=True)]
    gaps = [s.ttft_p50_ms - e.ttft_p50_ms for e, s in zip(engine, service, strict=True)]
    lines.append(
        f"\nservice / engine output tok/s, per round: {', '.join(f'{r:.2f}' for r in ratios)} "
        f"(median {statistics.median(ratios):.2f}x); service - engine TTFT p50 per round: "
        f"{', '.join(f'{g:.1f}' for g in gaps)} ms (median {statistics.median(gaps):.1f} ms)"
    )
    if peer:
        lines.append(peer_ratios(service, peer))
    return "\n".join(lines)


PEER_LABEL = "HF transformers serve (peer)"


def engine_thread_row(where: str, rounds: list[ThreadTimes]) -> str:
    """The engine thread's milliseconds on a CPU / waiting for one, per round: in process the bench runs nothing beside
    it; through the service the wait is the time the processes around it (and anything else on the machine) held the
    cores it could have run on."""
    times = ", ".join(f"{r.run_s * 1e3:.0f}/{r.wait_s * 1e3:.0f}" for r in rounds)
    run_ms = statistics.median(r.run_s for r in rounds) * 1e3
    wait_ms = statistics.median(r.wait_s for r in rounds) * 1e3
    return f"| the engine thread {where}: ms on a CPU / waiting for one | {times} | {run_ms:.0f}/{wait_ms:.0f} | | | |"


def peer_ratios(service: list[Measured], peer: list[Measured]) -> str:
    ratios = [s.tokens_per_s / p.tokens_per_s for s, p in zip(service, peer, strict=True)]
    ttft = [s.ttft_p50_ms / p.ttft_p50_ms for s, p in zip(service, peer, strict=True)]
    return (
        f"service / peer output tok/s, per round: {', '.join(f'{r:.2f}' for r in ratios)} "
        f"(median {statistics.median(ratios):.2f}x); service / peer TTFT p50 per round: "
        f"{', '.join(f'{r:.2f}' for r in ttft)} (median {statistics.median(ttft):.2f}x)"
    )


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
        "command": f".venv/bin/python -m bench.service.service_streams {shlex.join(argv)}",
        "machine": f"{cpu_description()}; torch {torch.__version__}, worker torch threads {config.cpu_threads}",
        "settings": {
            "max_num_seqs": config.max_num_seqs,
            "worker_concurrency": config.worker_threads,
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
    peer_skipped = "left out (--no-peer)" if args.no_peer else hf_serve_peer.peer_missing()
    with running_stack(config) as stack, ExitStack() as peer_scope:
        peer = None
        if peer_skipped is None:
            kv_tokens = sum(len(r.prompt_token_ids) + r.num_output_tokens for r in requests)
            server = peer_scope.enter_context(
                hf_serve_peer.running_peer(config.model, config.cpu_threads, config.max_num_batched_tokens, kv_tokens)
            )
            peer = hf_serve_peer.PeerStreamClient(server, requests)
            peer_scope.callback(peer.close)
        engine, service, peer_rounds = interleaved_rounds(config, stack, requests, args.rounds, peer)
    report = f"{table(engine, service, peer_rounds)}\n\nmachine: {cpu_description()}, load average {os.getloadavg()}"
    if peer_skipped is not None:
        report += f"\npeer (HF transformers serve): skipped, {peer_skipped}"
    print(report)
    if args.out is not None:
        args.out.write_text(report + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
