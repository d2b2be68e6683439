"""The int8 weight kernel alone against float32's `torch.nn.functional.linear`, over one decode step's linears of
the 135M model (30 layers of q, k, v, o, gate, up, down: 210 matmuls, every layer's weights distinct, so that each
step streams them all from memory as the engine's does), at several row counts, in alternating rounds.

Float32 weights are stored column-major, as the engine stores them (worker/engine/loading/cpu_weight_layout.py).
Per row count it prints the best and median milliseconds of a step for each, the ratio of the medians, and the rates
the best step reached (GFLOP/s of multiply-adds, GB/s of weights read), so that one can tell a step bound by reading
weights from one bound by arithmetic.

    .venv/bin/python -m bench.quantization.kernel_timing [--rows 1,4,8,16,32,64] [--rounds 15] [--threads 2] \
        [--plot out.png]

With --plot, the median milliseconds of a step against the rows, both ways, go to a PNG.
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from bench.random_model import SIZES
from worker.kernels.int8_matmul_kernel import load_int8_matmul_kernel

logger = logging.getLogger("bench.quantization.kernel_timing")

SIZE = SIZES["135m"]  # the benchmark's 135M model: SmolLM-135M's shape
HIDDEN, INTERMEDIATE, HEADS, KV_HEADS, LAYERS = (
    SIZE.hidden_size, SIZE.intermediate_size, SIZE.num_heads, SIZE.num_kv_heads, SIZE.num_layers
)  # fmt: skip
HEAD_DIM = HIDDEN // HEADS
# (in, out) of q, k, v, o, gate, up, down
LAYER_SHAPES = (
    (HIDDEN, HEADS * HEAD_DIM),
    (HIDDEN, KV_HEADS * HEAD_DIM),
    (HIDDEN, KV_HEADS * HEAD_DIM),
    (HEADS * HEAD_DIM, HIDDEN),
    (HIDDEN, INTERMEDIATE),
    (HIDDEN, INTERMEDIATE),
    (INTERMEDIATE, HIDDEN),
)


@dataclass(frozen=True)
class Linear:
    float_weight: torch.Tensor  # [out, in] float32, column-major
    codes: torch.Tensor  # [out, in] int8, contiguous
    scale: torch.Tensor  # [out] float32


def step_linears(generator: torch.Generator) -> list[Linear]:
    linears = []
    for _ in range(LAYERS):
        for width, num_out in LAYER_SHAPES:
            codes = torch.randint(-128, 128, (num_out, width), dtype=torch.int8, generator=generator)
            scale = torch.rand(num_out, generator=generator) / 64
            float_weight = (codes.float() * scale[:, None]).t().contiguous().t()
            linears.append(Linear(float_weight, codes, scale))
    return linears


def timed_step(
    run_one: Callable[[Linear, torch.Tensor], torch.Tensor],
    linears: list[Linear],
    rows: int,
    clock: Callable[[], float],
) -> float:
    """Seconds for one step: every linear once, its input of `rows` rows (inputs made before the clock starts)."""
    inputs = {width: torch.randn(rows, width) for width in {HIDDEN, INTERMEDIATE}}
    start = clock()
    for linear in linears:
        run_one(linear, inputs[linear.codes.shape[1]])
    return clock() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", default="1,4,8,16,32,64")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--plot", type=Path, help="write the plot (PNG) here")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    torch.set_num_threads(args.threads)
    kernel = load_int8_matmul_kernel()
    if kernel is None:
        logger.error("the int8 matmul kernel could not be built")
        return 1
    linears = step_linears(torch.Generator().manual_seed(0))
    params = sum(linear.codes.numel() for linear in linears)
    ways = {
        "float32": lambda linear, x: torch.nn.functional.linear(x, linear.float_weight),
        "int8 kernel": lambda linear, x: kernel(x, linear.codes, linear.scale, None),
    }
    # One thread computes in the calling thread (OpenMP and torch run a 1-thread region inline), so its CPU time is
    # the step's cost whatever else holds the cores; more threads are timed by the wall clock.
    clock = time.thread_time if args.threads == 1 else time.perf_counter
    clock_name = "thread CPU time" if args.threads == 1 else "wall clock"
    threads = "1 thread" if args.threads == 1 else f"{args.threads} threads"
    print(f"{params / 1e6:.1f}M weights a step, {threads} ({clock_name}), load average {os.getloadavg()}")
    print(
        "| rows | float32 ms (best, median) | int8 kernel ms (best, median) | float32 / int8 (medians) |"
        " float32 best GFLOP/s, GB/s | int8 best GFLOP/s, GB/s |"
    )
    print("|---|---|---|---|---|---|")
    medians: dict[str, dict[int, float]] = {name: {} for name in ways}
    for rows in (int(value) for value in args.rows.split(",")):
        seconds: dict[str, list[float]] = {name: [] for name in ways}
        for _ in range(args.rounds):
            for name, run_one in ways.items():
                seconds[name].append(timed_step(run_one, linears, rows, clock))
        best = {name: min(values) for name, values in seconds.items()}
        median = {name: statistics.median(values) for name, values in seconds.items()}
        for name, value in median.items():
            medians[name][rows] = value
        flops = 2 * rows * params
        rates = {
            name: f"{flops / best[name] / 1e9:.0f}, {params * bytes_per / best[name] / 1e9:.1f}"
            for name, bytes_per in (("float32", 4), ("int8 kernel", 1))
        }
        print(
            f"| {rows} | {best['float32'] * 1e3:.1f}, {median['float32'] * 1e3:.1f} "
            f"| {best['int8 kernel'] * 1e3:.1f}, {median['int8 kernel'] * 1e3:.1f} "
            f"| {median['float32'] / median['int8 kernel']:.2f}x | {rates['float32']} | {rates['int8 kernel']} |"
        )
    print(f"load average after: {os.getloadavg()}")
    if args.plot:
        plot_medians(medians, f"135M decode step's linears, {threads} ({clock_name})", args.plot)
    return 0


def plot_medians(medians: dict[str, dict[int, float]], title: str, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(6, 4))
    for name, by_rows in medians.items():
        axes.plot(list(by_rows), [seconds * 1e3 for seconds in by_rows.values()], marker="o", label=name)
    axes.set(xlabel="rows (requests in the decode step)", ylabel="ms a step, median of rounds", title=title)
    axes.set_xscale("log", base=2)
    axes.grid(alpha=0.3)
    axes.legend()
    figure.tight_layout()
    figure.savefig(out, metadata={"Software": None})
    plt.close(figure)


if __name__ == "__main__":
    sys.exit(main())
