"""The cost of tools offered in `tool_choice: "auto"` to rows that never start a call: every such row carries the
trigger grammar (free text; a call started with the parser's marker is held to the tools' schemas). Target: at most
5 % at 135M.

    .venv/bin/python -m bench.features.tool_trigger --random-config 135m [--num-requests 32] [--repeats 5]
        [--output-len 128] [--threads 1] [--out table.md]

Throughput: the same unconstrained rows (greedy, EOS ignored, so every row writes exactly --output-len tokens) with
the trigger grammar and with none, submitted at t=0 to one ContinuousEngine, interleaved round by round; the table
shows each one's median wall time, and its median CPU time (all the process's threads), which a loaded machine
disturbs far less.

Grammar work per step: what the trigger adds to each step, timed alone on the engine thread's own functions over
the tokens the no-grammar runs wrote: each row's matcher taking its token and filling its bitmask (on the engine a
thread of its own does this during the forward pass), the dead-end check and the logits mask; set against the mean
step of the no-grammar runs. This one stays readable on a loaded machine, where the runs' times spread widely.
"""

from __future__ import annotations

import argparse
import logging
import resource
import shlex
import statistics
import threading
import time
from pathlib import Path

import torch

from bench.engine_throughput import machine_description
from bench.features.structured import (
    TIMEOUT_S,
    WORD,
    Run,
    model_description,
    open_engine,
    record_schema,
    workload_description,
)
from bench.markdown_main import run_markdown_bench
from bench.random_model import SIZES
from bench.workload import BenchRequest
from tasks.messages.generation import SamplingParams
from tasks.messages.grammar import GrammarSpec, ToolCallGrammar, ToolFunction
from worker.engine.continuous_engine import ContinuousEngine, grammar_compiler
from worker.engine.grammar.masks import mask_logits, rows_allowing_nothing
from worker.engine.grammar.matcher import RowGrammar, fill_bitmasks
from worker.engine.interface import EngineOutput, EngineRequest

logger = logging.getLogger("bench.features.tool_trigger")
LABELS = ("no grammar", "auto-mode tool trigger")
CPU_SECONDS: dict[str, list[float]] = {}  # each run's, by label


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="models/tiny", help="HF model folder")
    parser.add_argument("--random-config", choices=sorted(SIZES), help="a random-init model of this size instead")
    parser.add_argument("--num-requests", type=int, default=32)
    parser.add_argument("--prompt-len", type=int, nargs=2, default=(32, 128), metavar=("MIN", "MAX"))
    parser.add_argument("--output-len", type=int, default=128, help="tokens every row generates")
    parser.add_argument("--repeats", type=int, default=5, help="runs of each; the table shows the median")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads(), help="torch intra-op threads")
    parser.add_argument("--out", type=Path, help="also write the markdown here")
    args = parser.parse_args(argv)
    args.dtype = "float32"  # what machine_description reports
    return args


def auto_tools_grammar() -> GrammarSpec:
    """Two tools offered with tool_choice "auto", as the api builds it (tools/grammar in api/structured)."""
    city = {"type": "object", "properties": {"city": WORD}, "required": ["city"]}
    tools = (ToolFunction("get_weather", city), ToolFunction("add_people", record_schema()))
    return ToolCallGrammar("hermes", tools, is_parallel=True, is_triggered=True).to_spec("tools")


def process_cpu_s() -> float:
    """CPU seconds of every thread of this process (the engine's, the mask filler's, xgrammar's): on a loaded
    machine a run's CPU time varies far less than its wall time."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def run_collecting(engine: ContinuousEngine, label: str, requests: list[EngineRequest]) -> tuple[Run, list[list[int]]]:
    """The run, and the tokens each request wrote (in `requests`' order)."""
    remaining = threading.Semaphore(0)
    written: dict[str, list[int]] = {request.request_id: [] for request in requests}
    errors: list[str] = []

    def on_output(output: EngineOutput) -> None:
        written[output.request_id].extend(output.new_token_ids)
        if output.is_finished:
            if output.error is not None:
                errors.append(output.error)
            remaining.release()

    started, cpu_started = time.perf_counter(), process_cpu_s()
    for request in requests:
        engine.submit(request, on_output)
    for _ in requests:
        if not remaining.acquire(timeout=TIMEOUT_S):
            raise RuntimeError(f"{label} did not finish within {TIMEOUT_S:.0f}s")
    if errors:
        raise RuntimeError(f"the engine failed a request: {errors[0]}")
    tokens = [written[request.request_id] for request in requests]
    CPU_SECONDS.setdefault(label, []).append(process_cpu_s() - cpu_started)
    return Run(label, time.perf_counter() - started, sum(map(len, tokens))), tokens


def throughput_runs(engine: ContinuousEngine, requests: list[BenchRequest], args: argparse.Namespace) -> tuple:
    """Both labels, interleaved round by round; and the tokens of the last no-grammar run."""
    sampling = SamplingParams(max_tokens=args.output_len, temperature=0.0, ignore_eos=True)
    runs, written = [], []
    for round_index in range(args.repeats):
        for label, grammar in zip(LABELS, (None, auto_tools_grammar()), strict=True):
            batch = [
                EngineRequest(f"{r.request_id}-t{round_index}-{grammar is None}", r.prompt_token_ids, sampling,
                              grammar=grammar)
                for r in requests
            ]  # fmt: skip
            run, tokens = run_collecting(engine, label, batch)
            runs.append(run)
            written = tokens if grammar is None else written
            logger.info("round %d, %s: %.2fs", round_index, label, run.seconds)
    return runs, written


def throughput_table(runs: list[Run]) -> str:
    lines = [
        "| every row unconstrained | median s | output tok/s | x no grammar | median CPU s | CPU x no grammar |",
        "|---|---|---|---|---|---|",
    ]
    rates, cpu = {}, {label: statistics.median(CPU_SECONDS[label]) for label in LABELS}
    for label in LABELS:
        mine = [run for run in runs if run.label == label]
        seconds = statistics.median(run.seconds for run in mine)
        rates[label] = rate = mine[0].num_tokens / seconds
        spread = f"{min(run.seconds for run in mine):.1f}-{max(run.seconds for run in mine):.1f} s"
        cpu_ratio = cpu[label] / cpu[LABELS[0]]
        lines.append(
            f"| {label} ({spread}) | {seconds:.2f} | {rate:.1f} | {rate / rates[LABELS[0]]:.3f}x | {cpu[label]:.2f} "
            f"| {cpu_ratio:.3f}x |"
        )
    return "\n".join(lines)


def grammar_work_table(matchers: list[RowGrammar], written: list[list[int]], vocab_size: int, step_s: float) -> str:
    """Per step: the matchers take the tokens the rows wrote, then fill, check and mask, timed apart."""
    logits = torch.randn(len(matchers), vocab_size)
    times: dict[str, list[float]] = {"accept and fill bitmasks": [], "dead-end check": [], "mask logits": []}
    num_refused = 0
    for step in range(min(map(len, written))):
        for grammar, tokens in zip(matchers, written, strict=True):
            grammar.pending_token_id = tokens[step - 1] if step else None
        started = time.perf_counter()
        bitmask = fill_bitmasks(matchers, vocab_size)
        filled = time.perf_counter()
        rows_allowing_nothing(bitmask, vocab_size, [()] * len(matchers))
        checked = time.perf_counter()
        mask_logits(logits, bitmask, list(range(len(matchers))))
        masked = time.perf_counter()
        for key, seconds in zip(times, (filled - started, checked - filled, masked - checked), strict=True):
            times[key].append(seconds)
        num_refused += sum(grammar.refused_token_id is not None for grammar in matchers)
    lines = [f"| grammar work per step, {len(matchers)} rows | median ms | p90 ms | share of a step |",
             "|---|---|---|---|"]  # fmt: skip
    total = [sum(parts) for parts in zip(*times.values(), strict=True)]
    for key, values in [*times.items(), ("all of it", total)]:
        median, p90 = statistics.median(values), statistics.quantiles(values, n=10)[8]
        lines.append(f"| {key} | {median * 1e3:.3f} | {p90 * 1e3:.3f} | {median / step_s:.2%} |")
    lines.append(f"\nMean step of the no-grammar runs: {step_s * 1e3:.1f} ms; tokens a matcher refused: {num_refused}")
    return "\n".join(lines)


def run_benchmark(args: argparse.Namespace, argv: list[str]) -> str:
    config, runner, requests = open_engine(args)
    grammar = auto_tools_grammar()
    engine = ContinuousEngine(runner, config)
    engine.start()
    try:
        warm = SamplingParams(max_tokens=4, temperature=0.0)
        run_collecting(
            engine, "warm-up", [EngineRequest("warm-tools", requests[0].prompt_token_ids, warm, grammar=grammar)]
        )
        runs, written = throughput_runs(engine, requests, args)
    finally:
        engine.stop()
    compiler = grammar_compiler(config, runner)
    matchers = [RowGrammar(compiler.compile(grammar)) for _ in requests]
    compiler.close()
    plain = [run for run in runs if run.label == LABELS[0]]
    step_s = statistics.median(run.seconds for run in plain) / args.output_len  # one decode step a token per row
    vocab_size = runner.model.config.vocab_size
    return "\n\n".join(
        [
            f"Machine: {machine_description(args)}",
            f"Command: `.venv/bin/python -m bench.features.tool_trigger {shlex.join(argv)}`",
            f"Model: {model_description(args)}",
            f"Workload: {workload_description(args)}",
            throughput_table(runs),
            grammar_work_table(matchers, written, vocab_size, step_s),
        ]
    )


def main(argv: list[str] | None = None) -> int:
    return run_markdown_bench(parse_args, run_benchmark, argv)


if __name__ == "__main__":
    raise SystemExit(main())
