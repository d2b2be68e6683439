"""The GPU benchmark: a random-init Llama-architecture model (1b: Llama-3.2-1B's shape, 1.24B parameters) built on the
device from a config, nothing downloaded, in bfloat16, through HF `generate` one request at a time, HF `generate`
with its static cache (compiled by torch.compile on a GPU), HF `generate_batch` (continuous batching), and our
engine eager and with CUDA graphs; at batch 1, 8, 32 and 64 (every request at t=0) and under Poisson arrivals. It
prints one summary table, batch-1 decode against the HBM roofline (the weights' bytes per step over a measured
device-to-device copy bandwidth) and the issue's targets, and writes them as markdown to --out.

    python3 -m bench.gpu --out gpu.md                              # on a CUDA machine (scripts/gpu/check.sh)
    python3 -m bench.gpu --size tiny --device cpu --out /tmp/g.md  # the smoke test: seconds, on a CPU

On a CPU the graph engine runs its padded static-buffer steps eagerly (Triton's interpreter attends), and HF's
static cache is not compiled. HF `generate` one at a time runs at batch 1 only (at batch B it would take B times
as long), and the static cache at fixed batches only (it compiles each batch shape).
"""

from __future__ import annotations

import argparse
import gc
import logging
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import transformers
from transformers import AutoModelForCausalLM, PreTrainedModel

from bench.engine_throughput import BenchEngine, pad_token_id, special_token_ids, summarize_all
from bench.engines.hf_continuous import HFContinuousBatching, has_continuous_batching
from bench.engines.hf_generate import NaiveGenerate, StaticCacheGenerate
from bench.engines.steerbatch_engine import SteerbatchEngine
from bench.gpu_report import copy_bandwidth, roofline_lines, target_lines, weight_bytes_per_step
from bench.metrics import RunResult, format_table
from bench.random_model import SIZES, random_model_dir
from bench.workload import BenchRequest, WorkloadSpec, make_workload
from tasks.config import Config
from worker.engine.model_runner import DTYPES, ModelRunner

logger = logging.getLogger("bench.gpu")

ENGINE_KEYS = ("naive", "static", "hf_cb", "steerbatch", "steerbatch_graphs")
FIXED_BATCH_ONLY = {"static"}  # engines that take every request at once, not arrivals
BATCH_1_ONLY = {"naive"}
POISSON = "poisson"
WARMUP_SPEC = WorkloadSpec(num_requests=2, prompt_len_range=(8, 32), output_len_range=(4, 8), seed=12345)


@dataclass(frozen=True)
class Scenario:
    name: str
    requests: list[BenchRequest]
    batch_size: int | None  # None: Poisson arrivals


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="the markdown report goes here")
    parser.add_argument("--size", default="1b", choices=sorted(SIZES))
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--dtype", default="bfloat16", choices=sorted(DTYPES))
    parser.add_argument("--batches", default="1,8,32,64", help="comma-separated batch sizes, all at t=0")
    parser.add_argument("--prompt-len", type=int, nargs=2, default=(64, 256), metavar=("MIN", "MAX"))
    parser.add_argument("--output-len", type=int, default=128, help="tokens every request generates")
    parser.add_argument("--poisson-requests", type=int, default=64)
    parser.add_argument("--poisson-rate", type=float, default=32.0, help="mean arrivals per second")
    parser.add_argument("--engines", default=",".join(ENGINE_KEYS), help=f"comma-separated, of {ENGINE_KEYS}")
    args = parser.parse_args(argv)
    unknown = set(args.engines.split(",")) - set(ENGINE_KEYS)
    if unknown:
        parser.error(f"unknown engines {sorted(unknown)}; choose from {ENGINE_KEYS}")
    return args


def build_scenarios(args: argparse.Namespace, model: PreTrainedModel) -> list[Scenario]:
    vocab_size, specials = model.config.vocab_size, special_token_ids(model)
    output_len = (args.output_len, args.output_len)
    scenarios = []
    for batch_size in (int(size) for size in args.batches.split(",")):
        spec = WorkloadSpec(batch_size, tuple(args.prompt_len), output_len, seed=batch_size)
        name = f"batch {batch_size}"
        scenarios.append(Scenario(name, make_workload(name, spec, vocab_size, specials, None), batch_size))
    spec = WorkloadSpec(args.poisson_requests, tuple(args.prompt_len), output_len, seed=0)
    requests = make_workload(POISSON, spec, vocab_size, specials, poisson_rate_per_s=args.poisson_rate)
    return [*scenarios, Scenario(POISSON, requests, None)]


def runs_on(key: str, scenario: Scenario) -> bool:
    if key in BATCH_1_ONLY:
        return scenario.batch_size == 1
    return scenario.batch_size is not None or key not in FIXED_BATCH_ONLY


def engine_config(args: argparse.Namespace, model_dir: Path, scenarios: list[Scenario], graphs: bool) -> Config:
    """Our engine's Config: batches up to the largest scenario's, a KV pool for all of it at once, no speculation
    (verify steps run eagerly), graphs on or off; on a CPU the Triton kernels under the interpreter."""
    max_rows = max(len(scenario.requests) for scenario in scenarios)
    max_tokens = max(len(r.prompt_token_ids) + r.num_output_tokens for s in scenarios for r in s.requests)
    on_cpu = args.device == "cpu"
    return Config(
        model=str(model_dir),
        device=args.device,
        dtype=args.dtype,
        max_num_seqs=max_rows,
        kv_cache_tokens=max_rows * (max_tokens + 16),
        speculative_method="none",
        attention_backend="triton" if on_cpu and graphs else "auto",
        cuda_graphs=("eager_replay" if on_cpu else "auto") if graphs else "off",
        cpu_threads=0,
    )


def engine_factories(
    args: argparse.Namespace, model: PreTrainedModel, model_dir: Path, scenarios: list[Scenario]
) -> dict[str, Callable[[], BenchEngine]]:
    pad = pad_token_id(model)
    eager, graphs = (engine_config(args, model_dir, scenarios, graphs) for graphs in (False, True))
    sizing = [request for scenario in scenarios for request in scenario.requests]
    return {
        "naive": lambda: NaiveGenerate(model, pad),
        "static": lambda: StaticCacheGenerate(model, pad),
        "hf_cb": lambda: HFContinuousBatching(model, sizing, eager.max_num_batched_tokens, eager.max_num_seqs),
        "steerbatch": lambda: SteerbatchEngine(ModelRunner(eager), eager),
        "steerbatch_graphs": lambda: SteerbatchEngine(ModelRunner(graphs), graphs),
    }


def run_engine(key: str, factory: Callable[[], BenchEngine], scenarios: list[Scenario], warmup: list) -> list:
    """Every scenario `key` runs, after a warm-up; the engine is closed and its memory given back after."""
    engine = factory()
    try:
        if key not in FIXED_BATCH_ONLY:  # the static cache warms itself up on each shape
            engine.run("warmup", warmup)
        results = []
        for scenario in (scenario for scenario in scenarios if runs_on(key, scenario)):
            started = time.perf_counter()
            results.append(engine.run(scenario.name, scenario.requests))
            logger.info("%s, %s: %.2fs", engine.label, scenario.name, time.perf_counter() - started)
        return results
    finally:
        engine.close()
        del engine
        release_memory()


def release_memory() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def describe(args: argparse.Namespace, model: PreTrainedModel, device: torch.device) -> str:
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    triton_version = getattr(sys.modules.get("triton"), "__version__", "not loaded")
    return (
        f"Device: {name}; torch {torch.__version__}, transformers {transformers.__version__}, triton "
        f"{triton_version}. Model: random-init Llama {args.size}, {model.num_parameters() / 1e6:.1f}M parameters, "
        f"{args.dtype}. Requests: prompts {args.prompt_len[0]}-{args.prompt_len[1]} tokens, {args.output_len} output "
        f"tokens each, greedy, EOS ignored; Poisson: {args.poisson_requests} requests at {args.poisson_rate:g}/s."
    )


def run_engines(
    args: argparse.Namespace, model: PreTrainedModel, model_dir: Path, scenarios: list[Scenario]
) -> tuple[list[RunResult], list[str]]:
    """Every selected engine's results, and a line for each one skipped (an HF baseline this install lacks)."""
    warmup = make_workload("warmup", WARMUP_SPEC, model.config.vocab_size, special_token_ids(model), None)
    factories = engine_factories(args, model, model_dir, scenarios)
    results: list[RunResult] = []
    skipped = []
    for key in args.engines.split(","):
        reason = skip_reason(key, args, model)
        if reason is None:
            try:
                results += run_engine(key, factories[key], scenarios, warmup)
                continue
            except Exception as exc:  # a baseline this install cannot run must not cost us our own numbers
                if key.startswith("steerbatch"):
                    raise
                logger.exception("%s failed", key)
                reason = f"failed: {type(exc).__name__}: {exc}"
        skipped.append(f"- {key} skipped: {reason}")
    return results, skipped


def skip_reason(key: str, args: argparse.Namespace, model: PreTrainedModel) -> str | None:
    if key == "hf_cb" and not has_continuous_batching(model):
        version = transformers.__version__
        return f"transformers {version} has no continuous batching API as bench/engines/hf_continuous.py uses it"
    if key == "steerbatch_graphs" and args.device == "cpu":
        from worker.engine.attention.backend import AttentionBackend, unavailable_reason

        return unavailable_reason(AttentionBackend.TRITON, torch.device("cpu"), DTYPES[args.dtype])
    return None


def run_benchmark(args: argparse.Namespace, argv: list[str]) -> str:
    device, dtype = torch.device(args.device), DTYPES[args.dtype]
    model_dir = random_model_dir(args.size, dtype)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).to(device).eval()
    bandwidth, weight_bytes = copy_bandwidth(device), weight_bytes_per_step(model)
    scenarios = build_scenarios(args, model)
    results, skipped = run_engines(args, model, model_dir, scenarios)
    order = [scenario.name for scenario in scenarios]
    results.sort(key=lambda result: (order.index(result.workload), ENGINE_KEYS.index(result.engine_key)))
    summaries = summarize_all(results)
    parts = [
        describe(args, model, device),
        f"Command: `python3 -m bench.gpu {' '.join(argv)}`",
        format_table(summaries),
        "\n".join(roofline_lines(summaries, weight_bytes, bandwidth)),
        "\n".join(target_lines(summaries, weight_bytes, bandwidth)),
    ]
    return "\n\n".join(parts + (["\n".join(skipped)] if skipped else []))


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    transformers.utils.logging.disable_progress_bar()
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    started = time.perf_counter()
    markdown = run_benchmark(args, argv)
    markdown += f"\n\nThe whole bench took {time.perf_counter() - started:.0f} s."
    print(markdown)
    args.out.write_text(markdown + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
