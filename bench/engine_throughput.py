"""Engine throughput: naive and static-batch HF `generate`, HF continuous batching, and our engine,
in one process on the same model, over 32 requests all at t=0 and the same requests as a Poisson stream.

    .venv/bin/python -m bench.engine_throughput --model models/tiny [--num-requests 32] [--seed 0]
        [--poisson-rate 24] [--engines naive,static,hf_cb,steerbatch,steerbatch_compiled] [--threads N]
        [--repeats N] [--out table.md] [--random-config 135m [--family qwen3]]

`--random-config SIZE` measures a random-init model of a realistic size instead of `--model` (bench/random_model.py:
135m is SmolLM-135M's shape with the tiny tokenizer's vocabulary), so that arithmetic, not Python, decides;
`--family` its architecture (Llama by default).

Every engine decodes greedily and ignores EOS, so each request generates exactly its own number of tokens and
every engine should produce the tokens of (i); the table counts the requests where it does. Each engine gets a
short warm-up before it is measured. The markdown table goes to stdout (and to --out); progress goes to the log.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import platform
import shlex
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import torch
import transformers
from transformers import AutoModelForCausalLM, PreTrainedModel

from bench.engines.hf_continuous import HFContinuousBatching, has_continuous_batching
from bench.engines.hf_generate import NaiveGenerate, StaticBatchGenerate
from bench.engines.steerbatch_engine import SteerbatchEngine
from bench.metrics import NAIVE_KEY, RunResult, Summary, format_table, summarize
from bench.random_model import FAMILIES, SIZES, random_model_dir
from bench.workload import BenchRequest, WorkloadSpec, make_workload
from tasks.config import Config
from worker.engine.model_runner import DTYPES, ModelRunner, read_eos_token_ids

logger = logging.getLogger("bench.engine_throughput")

ENGINE_KEYS = ("naive", "static", "hf_cb", "steerbatch", "steerbatch_compiled")
BURST, POISSON, WARMUP = "all-at-t=0", "poisson", "warmup"
CB_LOGGER = "ContinuousBatchingLogger"  # transformers' continuous batching logs every start and stop at INFO
WARMUP_SPEC = WorkloadSpec(num_requests=2, prompt_len_range=(8, 32), output_len_range=(4, 8), seed=12345)


class BenchEngine(Protocol):
    key: str
    label: str

    def run(self, workload: str, requests: list[BenchRequest]) -> RunResult: ...

    def close(self) -> None: ...


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="models/tiny", help="HF model folder")
    parser.add_argument(
        "--random-config", choices=sorted(SIZES), help="a random-init model of this size instead of --model"
    )
    parser.add_argument("--family", default="llama", choices=FAMILIES, help="the --random-config model's architecture")
    parser.add_argument("--num-requests", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0, help="seeds prompts, lengths and arrivals")
    parser.add_argument("--prompt-len", type=int, nargs=2, default=(32, 256), metavar=("MIN", "MAX"))
    parser.add_argument("--output-len", type=int, nargs=2, default=(64, 128), metavar=("MIN", "MAX"))
    # 24/s: with seed 0 the 32 arrivals span 1.1s, about half the all-at-t=0 runs of (iii)/(iv) on the 2-core CPU
    parser.add_argument("--poisson-rate", type=float, default=24.0, help="mean arrivals per second")
    parser.add_argument("--engines", default=",".join(ENGINE_KEYS), help=f"comma-separated, of {ENGINE_KEYS}")
    parser.add_argument("--dtype", default="float32", choices=sorted(DTYPES))
    parser.add_argument(
        "--threads",
        type=int,
        default=torch.get_num_threads(),
        help="torch intra-op threads; on a CPU other processes share, 1 gives steadier numbers",
    )
    parser.add_argument("--max-num-seqs", type=int, default=32, help="the engines' batch size limit")
    parser.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="rounds of every engine, interleaved, each engine opened afresh (no prefix cache carried over); the "
        "table shows each engine's median round by wall time (the faster middle one for an even count)",
    )
    parser.add_argument("--out", type=Path, help="also write the markdown (machine, command, table) here")
    args = parser.parse_args(argv)
    unknown = set(args.engines.split(",")) - set(ENGINE_KEYS)
    if unknown:
        parser.error(f"unknown engines {sorted(unknown)}; choose from {ENGINE_KEYS}")
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    return args


def cpu_description() -> str:
    cpu_model = platform.processor() or "unknown CPU"
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        names = [
            line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines() if line.startswith("model name")
        ]
        cpu_model = names[0] if names else cpu_model
    return f"{cpu_model}, {os.cpu_count()} logical CPUs ({len(os.sched_getaffinity(0))} usable)"


def machine_description(args: argparse.Namespace) -> str:
    return (
        f"{cpu_description()}; torch {torch.__version__}, transformers {transformers.__version__}, "
        f"{args.dtype} on cpu, {torch.get_num_threads()} torch threads"
    )


def special_token_ids(model: PreTrainedModel) -> set[int]:
    ids = set(read_eos_token_ids(model))
    for source in (model.generation_config, model.config):
        ids.update(token_id for token_id in (source.bos_token_id, source.pad_token_id) if token_id is not None)
    return ids


def pad_token_id(model: PreTrainedModel) -> int:
    """Any id works (padded positions are masked); the model's own pad when it has one."""
    for source in (model.generation_config, model.config):
        if source.pad_token_id is not None:
            return int(source.pad_token_id)
    return 0


def build_workloads(args: argparse.Namespace, model: PreTrainedModel) -> dict[str, list[BenchRequest]]:
    spec = WorkloadSpec(args.num_requests, tuple(args.prompt_len), tuple(args.output_len), args.seed)
    vocab_size, specials = model.config.vocab_size, special_token_ids(model)
    return {
        BURST: make_workload(BURST, spec, vocab_size, specials, poisson_rate_per_s=None),
        POISSON: make_workload(POISSON, spec, vocab_size, specials, poisson_rate_per_s=args.poisson_rate),
    }


def engine_factories(
    args: argparse.Namespace, model: PreTrainedModel, workloads: dict[str, list[BenchRequest]]
) -> dict[str, Callable[[], BenchEngine]]:
    """Each engine opened only when its turn comes; ours loads its own copy of the model through ModelRunner, so
    nothing the HF baselines do to their model (HF continuous batching switches its attention) reaches it."""
    config = Config(
        model=args.model, max_num_seqs=args.max_num_seqs, device="cpu", dtype=args.dtype, cpu_threads=args.threads
    )
    compiled = dataclasses.replace(config, torch_compile=True)  # compiled at load, outside the timed runs
    pad = pad_token_id(model)
    return {
        "naive": lambda: NaiveGenerate(model, pad),
        "static": lambda: StaticBatchGenerate(model, pad),
        "hf_cb": lambda: HFContinuousBatching(
            model, workloads[BURST], config.max_num_batched_tokens, config.max_num_seqs
        ),
        "steerbatch": lambda: SteerbatchEngine(ModelRunner(config), config),
        "steerbatch_compiled": lambda: SteerbatchEngine(ModelRunner(compiled), compiled),
    }


def run_engine(
    engine: BenchEngine, workloads: dict[str, list[BenchRequest]], warmup: list[BenchRequest]
) -> list[RunResult]:
    engine.run(WARMUP, warmup)
    results = []
    for name, requests in workloads.items():
        started = time.perf_counter()
        results.append(engine.run(name, requests))
        logger.info("%s, %s: %.2fs", engine.label, name, time.perf_counter() - started)
    return results


def median_runs(rounds: list[list[RunResult]]) -> tuple[list[RunResult], dict[tuple[str, str], list[float]]]:
    """Each (workload, engine)'s run of median wall time across the rounds, and every round's output tok/s."""
    by_cell: dict[tuple[str, str], list[RunResult]] = {}
    for result in (result for round_results in rounds for result in round_results):
        by_cell.setdefault((result.workload, result.engine_key), []).append(result)
    medians, throughputs = [], {}
    for cell, runs in by_cell.items():
        summaries = [summarize(run, None) for run in runs]
        by_wall = sorted(zip(summaries, runs, strict=True), key=lambda pair: pair[0].wall_s)
        medians.append(by_wall[(len(by_wall) - 1) // 2][1])
        throughputs[cell] = [summary.tokens_per_s for summary in summaries]
    return medians, throughputs


def format_rounds(throughputs: dict[tuple[str, str], list[float]], labels: dict[str, str]) -> str:
    """Every round's tok/s, and each of our engines' ratio to each baseline within a round, whose median does not
    pair one engine's fast round with another's slow one as the table's medians can on a noisy machine."""
    lines = [
        f"- {workload}, {labels[key]}: " + ", ".join(f"{value:.0f}" for value in values)
        for (workload, key), values in throughputs.items()
    ]
    ratios = []
    for (workload, key), values in throughputs.items():
        if not key.startswith("steerbatch"):
            continue
        for baseline in ("naive", "static", "hf_cb"):
            base = throughputs.get((workload, baseline))
            if base:
                per_round = [ours / theirs for ours, theirs in zip(values, base, strict=True)]
                ratios.append(
                    f"- {workload}, {labels[key]} / {labels[baseline]}: "
                    + ", ".join(f"{ratio:.2f}x" for ratio in per_round)
                    + f" (median {statistics.median(per_round):.2f}x)"
                )
    parts = ["Output tok/s of each round:", "\n".join(lines)]
    if ratios:
        parts += ["Ratios within each round:", "\n".join(ratios)]
    return "\n\n".join(parts)


def summarize_all(results: list[RunResult]) -> list[Summary]:
    naive_tokens = {
        result.workload: {trace.request_id: trace.token_ids for trace in result.traces}
        for result in results
        if result.engine_key == NAIVE_KEY
    }
    return [summarize(result, naive_tokens.get(result.workload)) for result in results]


def selected_engines(args: argparse.Namespace, model: PreTrainedModel) -> list[str]:
    keys = args.engines.split(",")
    if "hf_cb" in keys and not has_continuous_batching(model):
        logger.warning("transformers %s has no continuous batching: skipping (iii)", transformers.__version__)
        keys.remove("hf_cb")
    return keys


def format_report(args: argparse.Namespace, argv: list[str], poisson_span_s: float, table: str, rounds: str) -> str:
    parts = [
        f"Machine: {machine_description(args)}",
        f"Command: `.venv/bin/python -m bench.engine_throughput {shlex.join(argv)}`",
        f"Workload: {args.num_requests} requests, prompts {args.prompt_len[0]}-{args.prompt_len[1]} tokens, "
        f"outputs {args.output_len[0]}-{args.output_len[1]} tokens, seed {args.seed}; "
        f"Poisson at {args.poisson_rate:g}/s (arrivals span {poisson_span_s:.1f}s)",
        table,
    ]
    if args.repeats > 1:
        parts.append(rounds)
    return "\n\n".join(parts)


def run_benchmark(args: argparse.Namespace, argv: list[str]) -> str:
    """Runs the selected engines over both workloads; returns the markdown: machine, command, workload, table."""
    torch.set_num_threads(args.threads)
    if args.random_config is not None:
        args.model = str(random_model_dir(args.random_config, DTYPES[args.dtype], family=args.family))
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=DTYPES[args.dtype]).eval()
    workloads = build_workloads(args, model)
    warmup = make_workload(WARMUP, WARMUP_SPEC, model.config.vocab_size, special_token_ids(model), None)
    factories = engine_factories(args, model, workloads)
    keys = selected_engines(args, model)
    rounds: list[list[RunResult]] = []
    for round_index in range(args.repeats):
        round_results = []
        for key in keys:
            logger.info("round %d of %d: opening %s", round_index + 1, args.repeats, key)
            engine = factories[key]()
            try:
                round_results.extend(run_engine(engine, workloads, warmup))
            finally:
                engine.close()
        rounds.append(round_results)
    results, throughputs = median_runs(rounds)
    results.sort(key=lambda result: (list(workloads).index(result.workload), keys.index(result.engine_key)))
    labels = {result.engine_key: result.engine_label for result in results}
    poisson_span_s = max(request.arrival_s for request in workloads[POISSON])
    table = format_table(summarize_all(results))
    return format_report(args, argv, poisson_span_s, table, format_rounds(throughputs, labels))


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    transformers.utils.logging.disable_progress_bar()
    logging.getLogger(CB_LOGGER).setLevel(logging.WARNING)
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    markdown = run_benchmark(args, argv)
    print(markdown)
    if args.out is not None:
        args.out.write_text(markdown + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
