"""Speculative decoding benchmark: each proposer (prompt lookup, a draft model, the model's own first
layers) against no speculation, at batch 1, 4 and 8, on an input-grounded workload (an opening, the text the model
writes after it, and the opening again: what the request generates is in its input) and an open-ended one (the
opening alone), 64 tokens each, greedy with EOS ignored.

Per cell: output tokens/s (median of alternating runs), the ratio to no speculation, the acceptance rate a (accepted
/ proposed), mean tokens per verifying step (accepted / verifications + 1), and the tokens per step Leviathan et
al.'s formula predicts for k proposed tokens at that rate, (1 - a^(k+1)) / (1 - a).

    make draft-model   # models/tiny-draft: 1 layer, the tiny model's tokenizer and corpus
    .venv/bin/python -m bench.features.speculation --model models/tiny --draft-model models/tiny-draft [--threads N]
        [--repeats 3] [--methods none,ngram,draft,self] [--max-batch-size N]

Every method runs with the worker's defaults (SPEC_MAX_BATCH_SIZE included) unless --max-batch-size overrides the
batch size above which nothing is proposed.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import random
import statistics

import torch
from transformers import AutoModelForCausalLM, PreTrainedModel, PreTrainedTokenizerFast

from bench.engine_throughput import machine_description
from bench.engines.steerbatch_engine import SteerbatchEngine
from bench.metrics import summarize
from bench.workload import BenchRequest
from scripts.tiny_corpus import NAMES, build_story
from tasks.config import Config
from tasks.logs import configure_logging
from worker.engine.model_runner import ModelRunner

logger = logging.getLogger(__name__)
OPEN_LEN = 64
BATCH_SIZES = (1, 4, 8)
ROUNDS = 6


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="models/tiny")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--num-tokens", type=int, default=4, help="proposed tokens per step")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--draft-model", default="models/tiny-draft")
    parser.add_argument("--methods", default="none,ngram,draft,self", help="comma-separated; none is always run")
    parser.add_argument("--max-batch-size", type=int, default=None, help="SPEC_MAX_BATCH_SIZE (default: Config's)")
    return parser.parse_args(argv)


def request(
    kind: str, request_id: str, rng: random.Random, tokenizer: PreTrainedTokenizerFast, model: PreTrainedModel
) -> BenchRequest:
    """open: a corpus story's first words; the request generates OPEN_LEN tokens. grounded: the same kind of
    opening, the model's own greedy continuation of it, then the opening again; the request generates the
    continuation's length, which the input holds (the tiny model does not copy arbitrary text, so the grounding
    text is what it would write)."""
    opening = tokenizer.encode(" ".join(build_story(rng, rng.choice(NAMES)).split()[:3]))
    if kind == "open":
        return BenchRequest(request_id, opening, OPEN_LEN, 0.0)
    with torch.no_grad():
        generated = model.generate(torch.tensor([opening]), do_sample=False, max_new_tokens=OPEN_LEN, eos_token_id=None)
    continuation = generated[0, len(opening) :].tolist()
    return BenchRequest(request_id, [*opening, *continuation, *opening], OPEN_LEN, 0.0)


def requests(
    kind: str, batch_size: int, tokenizer: PreTrainedTokenizerFast, model: PreTrainedModel
) -> list[list[BenchRequest]]:
    """ROUNDS rounds of `batch_size` requests arriving together."""
    rng = random.Random(f"{kind}-{batch_size}")
    return [
        [request(kind, f"{kind}-{round_index}-{i}", rng, tokenizer, model) for i in range(batch_size)]
        for round_index in range(ROUNDS)
    ]


@dataclasses.dataclass
class Cell:
    tokens_per_s: list[float] = dataclasses.field(default_factory=list)
    proposed: int = 0
    accepted: int = 0
    verifications: int = 0


def run_cell(runner: ModelRunner, config: Config, rounds: list[list[BenchRequest]], cell: Cell) -> None:
    engine = SteerbatchEngine(runner, config)
    try:
        tokens, seconds = 0, 0.0
        for round_requests in rounds:
            summary = summarize(engine.run("speculation", round_requests), None)
            tokens += summary.num_useful_tokens
            seconds += summary.wall_s
        stats = engine.stats
    finally:
        engine.close()
    cell.tokens_per_s.append(tokens / seconds)
    cell.proposed += stats.num_proposed_tokens
    cell.accepted += stats.num_accepted_tokens
    cell.verifications += stats.num_verifications


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    configure_logging(Config())
    torch.set_num_threads(args.threads)
    base = Config(
        model=args.model,
        device="cpu",
        dtype=args.dtype,
        num_speculative_tokens=args.num_tokens,
        cpu_threads=args.threads,
        speculative_draft_model=args.draft_model,
    )
    if args.max_batch_size is not None:
        base = dataclasses.replace(base, spec_max_batch_size=args.max_batch_size)
    runner = ModelRunner(base)
    names = ["none", *(name for name in args.methods.split(",") if name != "none")]
    methods = {name: dataclasses.replace(base, speculative_method=name) for name in names}
    cells: dict[tuple[str, int, str], Cell] = {}
    tokenizer = PreTrainedTokenizerFast.from_pretrained(args.model)
    reference = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    workloads = {
        (kind, size): requests(kind, size, tokenizer, reference)
        for kind in ("grounded", "open")
        for size in BATCH_SIZES
    }
    run_cell(runner, base, [workloads["open", 1][0][:1]], Cell())  # warm-up
    for repeat in range(args.repeats):
        for (kind, size), rounds in workloads.items():
            for method, config in methods.items():
                run_cell(runner, config, rounds, cells.setdefault((kind, size, method), Cell()))
        logger.info("repeat %d done", repeat)
    print(report(args, machine_description(args), cells))
    return 0


def report(args: argparse.Namespace, machine: str, cells: dict[tuple[str, int, str], Cell]) -> str:
    k = args.num_tokens
    lines = [
        f"Machine: {machine}",
        "",
        f"grounded: an opening, the model's own continuation, the opening again; open: the opening alone; "
        f"{OPEN_LEN} output tokens; "
        f"k = {k} (the most; it adapts per request); no proposals above batch "
        f"{args.max_batch_size or Config().spec_max_batch_size}; medians of {args.repeats} alternating runs",
        "",
        "| workload | batch | method | output tok/s | x none | acceptance a | tokens / verifying step | formula |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for (kind, size, method), cell in cells.items():
        speed = statistics.median(cell.tokens_per_s)
        ratio = speed / statistics.median(cells[kind, size, "none"].tokens_per_s)
        if cell.proposed:
            rate = cell.accepted / cell.proposed
            per_step = 1 + cell.accepted / cell.verifications
            formula = (1 - rate ** (k + 1)) / (1 - rate) if rate < 1 else k + 1
            extra = f"{rate:.2f} | {per_step:.2f} | {formula:.2f}"
        else:
            extra = "— | — | —"
        lines.append(f"| {kind} | {size} | {method} | {speed:.1f} | {ratio:.2f}x | {extra} |")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
