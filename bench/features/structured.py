"""Structured-output cost (issue 18): throughput with 0 %, 50 % and 100 % of the rows constrained by a realistic
JSON schema, in one process; what constrained rows give up by not speculating; grammar compile times. The trigger
grammar of tools offered in auto mode has its own: bench/features/tool_trigger.py.

    .venv/bin/python -m bench.features.structured --model models/tiny [--num-requests 32] [--repeats 3] [--threads N]
        [--num-schemas 50] [--out table.md] [--random-config 135m] [--cases throughput speculation compile]

`--random-config 135m` runs a random-init model of SmolLM-135M's shape on the tiny tokenizer's vocabulary
(bench/random_model.py) instead of `--model`: the tiny model's steps are mostly per-operator overhead, so the
grammar's fixed cost per step weighs more there than at any realistic size.

Throughput: every run submits the same requests at t=0 (greedy) to one ContinuousEngine with prefix caching and
speculation off. Unconstrained rows ignore EOS; constrained rows follow a schema of a list of at least 24 records,
longer than max_tokens, so every row generates exactly its max_tokens and the runs differ only in the grammar work
(bitmask fill, mask, matcher advance). Mixes are interleaved round by round; the table shows each mix's median.
The target is at least 0.9x of unconstrained throughput with every row constrained.

Speculation: constrained rows never speculate. Two requests (a batch small enough to speculate in) whose prompt
holds the JSON they go on to write, greedy, unconstrained with ngram proposals, unconstrained without, and
constrained: the first two's gap is what a constrained row gives up.

Compile: `--num-schemas` distinct variants of the schema through the worker's GrammarCompiler, cold (each a
compile) and again (each a cache hit).
"""

from __future__ import annotations

import argparse
import json
import logging
import shlex
import statistics
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import PreTrainedTokenizerFast

from bench.engine_throughput import machine_description, special_token_ids
from bench.markdown_main import run_markdown_bench
from bench.random_model import SIZES, random_model_dir
from bench.workload import BenchRequest, WorkloadSpec, make_workload
from tasks.config import Config
from tasks.messages.generation import SamplingParams
from tasks.messages.grammar import GrammarKind, GrammarSpec
from worker.engine.continuous_engine import ContinuousEngine, grammar_compiler
from worker.engine.interface import EngineOutput, EngineRequest
from worker.engine.model_runner import ModelRunner

logger = logging.getLogger("bench.features.structured")

CONSTRAINED_FRACTIONS = (0.0, 0.5, 1.0)
CASES = ("throughput", "speculation", "compile")
TIMEOUT_S = 600.0
COMPILE_TIMEOUT_S = 60.0
WORD = {"type": "string", "maxLength": 16}


def record_schema(variant: int = 0) -> dict:
    """A list of people records, as an extraction request asks for; `variant` renames one field so each variant
    is a distinct grammar."""
    person = {
        "type": "object",
        "properties": {
            "name": WORD,
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "city": WORD,
            "role": {"enum": ["admin", "editor", "viewer"]},
            "tags": {"type": "array", "items": WORD, "maxItems": 3},
            f"active{variant or ''}": {"type": "boolean"},
        },
        "required": ["name", "age", "role"],
    }
    people = {"type": "array", "items": person, "minItems": 24}
    return {"type": "object", "properties": {"people": people}, "required": ["people"]}


@dataclass(frozen=True)
class Run:
    label: str
    seconds: float
    num_tokens: int


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="models/tiny", help="HF model folder")
    parser.add_argument("--num-requests", type=int, default=32)
    parser.add_argument("--prompt-len", type=int, nargs=2, default=(32, 128), metavar=("MIN", "MAX"))
    parser.add_argument("--output-len", type=int, default=128, help="tokens every row generates")
    parser.add_argument("--repeats", type=int, default=3, help="runs per mix; the table shows the median")
    parser.add_argument("--num-schemas", type=int, default=50, help="distinct schemas compiled for the compile table")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads(), help="torch intra-op threads")
    parser.add_argument("--out", type=Path, help="also write the markdown here")
    parser.add_argument("--cases", nargs="+", choices=CASES, default=CASES, help="which tables to measure")
    parser.add_argument(
        "--random-config", choices=sorted(SIZES), help="a random-init model of this size instead of --model"
    )
    args = parser.parse_args(argv)
    args.dtype = "float32"  # what machine_description reports
    return args


def is_constrained(index: int, fraction: float) -> bool:
    """Spreads the constrained rows evenly over the requests: every other one at 50 %."""
    return int((index + 1) * fraction) > int(index * fraction)


def run_requests(engine: ContinuousEngine, label: str, requests: list[EngineRequest]) -> Run:
    remaining = threading.Semaphore(0)
    errors: list[str] = []
    num_tokens = [0]

    def on_output(output: EngineOutput) -> None:
        num_tokens[0] += len(output.new_token_ids)
        if output.is_finished:
            if output.error is not None:
                errors.append(output.error)
            remaining.release()

    started = time.perf_counter()
    for request in requests:
        engine.submit(request, on_output)
    for _ in requests:
        if not remaining.acquire(timeout=TIMEOUT_S):
            raise RuntimeError(f"{label} did not finish within {TIMEOUT_S:.0f}s")
    if errors:
        raise RuntimeError(f"the engine failed a request: {errors[0]}")
    return Run(label, time.perf_counter() - started, num_tokens[0])


def mix(requests: list[BenchRequest], fraction: float, grammar: GrammarSpec, num_tokens: int, tag: str) -> list:
    plain = SamplingParams(max_tokens=num_tokens, temperature=0.0, ignore_eos=True)
    constrained = SamplingParams(max_tokens=num_tokens, temperature=0.0)
    return [
        EngineRequest(f"{r.request_id}-{tag}", r.prompt_token_ids, constrained, grammar=grammar)
        if is_constrained(i, fraction)
        else EngineRequest(f"{r.request_id}-{tag}", r.prompt_token_ids, plain)
        for i, r in enumerate(requests)
    ]


def throughput_table(runs: list[Run], num_requests: int) -> str:
    lines = [
        "| constrained rows | requests | output tokens | median s | output tok/s | x unconstrained |",
        "|---|---|---|---|---|---|",
    ]
    base = None
    for fraction in CONSTRAINED_FRACTIONS:
        mine = [run for run in runs if run.label == f"{fraction:.0%}"]
        seconds = statistics.median(run.seconds for run in mine)
        rate = mine[0].num_tokens / seconds
        base = base or rate
        row = [
            f"{fraction:.0%}",
            num_requests,
            mine[0].num_tokens,
            f"{seconds:.2f}",
            f"{rate:.1f}",
            f"{rate / base:.2f}x",
        ]
        lines.append("| " + " | ".join(str(cell) for cell in row) + " |")
    return "\n".join(lines)


def speculation_table(runs: list[Run]) -> str:
    lines = ["| 2 requests, greedy | median s | output tok/s |", "|---|---|---|"]
    for label in (
        "unconstrained, ngram speculation",
        "unconstrained, no speculation",
        "constrained (never speculates)",
    ):
        mine = [run for run in runs if run.label == label]
        seconds = statistics.median(run.seconds for run in mine)
        lines.append(f"| {label} | {seconds:.2f} | {mine[0].num_tokens / seconds:.1f} |")
    return "\n".join(lines)


def speculation_runs(engine: ContinuousEngine, tokenizer: PreTrainedTokenizerFast, args: argparse.Namespace) -> list:
    example = json.dumps({"people": [{"name": "Anna", "age": 31, "role": "admin"}] * 4})
    text = f"Here are the people as JSON: {example}\nAgain, the people as JSON: "
    prompt = tokenizer.encode(text)
    grammar = GrammarSpec(GrammarKind.JSON_SCHEMA, json.dumps(record_schema()), "bench")
    cases = {
        "unconstrained, ngram speculation": (SamplingParams(max_tokens=args.output_len, temperature=0.0,
                                             ignore_eos=True, speculative_method="ngram"), None),
        "unconstrained, no speculation": (SamplingParams(max_tokens=args.output_len, temperature=0.0,
                                          ignore_eos=True, speculative_method="none"), None),
        "constrained (never speculates)": (SamplingParams(max_tokens=args.output_len, temperature=0.0), grammar),
    }  # fmt: skip
    runs = []
    for round_index in range(args.repeats):
        for label, (sampling, spec) in cases.items():
            requests = [
                EngineRequest(f"spec-{round_index}-{label}-{i}", prompt, sampling, grammar=spec) for i in (0, 1)
            ]
            runs.append(run_requests(engine, label, requests))
    return runs


def compile_table(config: Config, runner: ModelRunner, num_schemas: int) -> str:
    compiler = grammar_compiler(config, runner)
    specs = [
        GrammarSpec(GrammarKind.JSON_SCHEMA, json.dumps(record_schema(v + 1)), "bench") for v in range(num_schemas)
    ]
    lines = ["| grammar compile | schemas | p50 ms | p99 ms |", "|---|---|---|---|"]
    for label in ("cold (compiled)", "cached (hit)"):
        times = []
        for spec in specs:
            started = time.perf_counter()
            compiler.compile(spec)
            times.append((time.perf_counter() - started) * 1000)
        p50, p99 = statistics.quantiles(times, n=100)[49], statistics.quantiles(times, n=100)[98]
        lines.append(f"| {label} | {num_schemas} | {p50:.3f} | {p99:.3f} |")
    compiler.close()
    return "\n".join(lines)


def model_description(args: argparse.Namespace) -> str:
    return f"{args.random_config} random-init (bench/random_model.py)" if args.random_config else args.model


def open_engine(args: argparse.Namespace) -> tuple[Config, ModelRunner, list[BenchRequest]]:
    """The model (`--random-config` builds it), a CPU engine config with prefix caching and speculation off, and
    the workload's requests. Grammars get a minute to compile: a busy machine would otherwise fail the warm-up."""
    torch.set_num_threads(args.threads)
    if args.random_config is not None:
        args.model = str(random_model_dir(args.random_config, torch.float32))
    config = Config(
        model=args.model,
        device="cpu",
        dtype="float32",
        max_num_seqs=max(Config.max_num_seqs, args.num_requests),
        enable_prefix_caching=False,
        speculative_method="none",
        cpu_threads=args.threads,
        grammar_compile_timeout_s=COMPILE_TIMEOUT_S,
    )
    runner = ModelRunner(config)
    spec = WorkloadSpec(args.num_requests, tuple(args.prompt_len), (args.output_len, args.output_len), args.seed)
    requests = make_workload("json", spec, runner.model.config.vocab_size, special_token_ids(runner.model), None)
    return config, runner, requests


def workload_description(args: argparse.Namespace) -> str:
    return (
        f"{args.num_requests} requests at t=0, prompts {args.prompt_len[0]}-{args.prompt_len[1]} tokens, "
        f"{args.output_len} output tokens each, seed {args.seed}; median of {args.repeats} interleaved runs"
    )


def run_benchmark(args: argparse.Namespace, argv: list[str]) -> str:
    config, runner, requests = open_engine(args)
    tokenizer = PreTrainedTokenizerFast.from_pretrained(args.model)
    grammar = GrammarSpec(GrammarKind.JSON_SCHEMA, json.dumps(record_schema()), "bench")
    # before the engine: its own compiler, cold
    tables = {"compile": compile_table(config, runner, args.num_schemas)} if "compile" in args.cases else {}
    engine = ContinuousEngine(runner, config)
    engine.start()
    try:
        run_requests(engine, "warm-up", mix(requests[:2], 1.0, grammar, 8, "warm"))  # and the grammar compiled
        if "throughput" in args.cases:
            tables["throughput"] = throughput_table(throughput_runs(engine, requests, grammar, args), args.num_requests)
        if "speculation" in args.cases:
            tables["speculation"] = speculation_table(speculation_runs(engine, tokenizer, args))
    finally:
        engine.stop()
    return "\n\n".join(
        [
            f"Machine: {machine_description(args)}",
            f"Command: `.venv/bin/python -m bench.features.structured {shlex.join(argv)}`",
            f"Model: {model_description(args)}",
            f"Workload: {workload_description(args)}; constrained rows follow a JSON schema of people records "
            "(nested objects, enums, arrays, bounded strings)",
            *(tables[case] for case in CASES if case in tables),
        ]
    )


def throughput_runs(
    engine: ContinuousEngine, requests: list[BenchRequest], grammar: GrammarSpec, args: argparse.Namespace
) -> list[Run]:
    """Every mix of constrained rows, interleaved round by round."""
    runs = []
    for round_index in range(args.repeats):
        for fraction in CONSTRAINED_FRACTIONS:
            label = f"{fraction:.0%}"
            batch = mix(requests, fraction, grammar, args.output_len, f"{round_index}{label}")
            runs.append(run_requests(engine, label, batch))
            logger.info("round %d, %s constrained: %.2fs", round_index, label, runs[-1].seconds)
    return runs


def main(argv: list[str] | None = None) -> int:
    return run_markdown_bench(parse_args, run_benchmark, argv)


if __name__ == "__main__":
    raise SystemExit(main())
