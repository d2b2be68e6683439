"""The plots in docs/BENCHMARKS.md, drawn from the numbers in one JSON file, so that they can be redrawn and checked.

    .venv/bin/python -m bench.plots [--data docs/data/benchmarks.json] [--out-dir docs/img]
        [--engine-table engine.md [--engine-section engine_throughput_135m]] [--service-load load.json]
        [--commit abc1234]

--engine-table (the markdown `bench.engine_throughput --out` writes) and --service-load (the JSON
`bench.service.service_streams --concurrency-levels ... --json` writes) first replace that section of the data file,
noted as measured at --commit (default: the checkout's HEAD); --engine-section names the engine section (default
engine_throughput; another, such as engine_throughput_135m, keeps a second model's run beside it). Then the plots are
drawn from the data file: <engine section>.png for each engine section (output tokens/s of each engine, its median
round, with the range of its rounds) and service_load.png (TTFT p50 and p99, and output tokens/s, against the number
of streams at once).
"""

from __future__ import annotations

import argparse
import json
import subprocess
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only, no display

import matplotlib.pyplot as plt

from bench.metrics import COLUMNS

ENGINE_SECTION, LOAD_PLOT = "engine_throughput", "service_load.png"
ENGINE_PLOT = f"{ENGINE_SECTION}.png"
PNG_METADATA = {"Software": None}  # no matplotlib version in the file: redrawing the same numbers changes nothing


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=Path("docs/data/benchmarks.json"))
    parser.add_argument("--out-dir", type=Path, default=Path("docs/img"))
    parser.add_argument("--engine-table", type=Path, help="bench.engine_throughput's markdown, to import first")
    parser.add_argument("--engine-section", default=ENGINE_SECTION, help="the data file's section it goes to")
    parser.add_argument("--service-load", type=Path, help="bench.service.service_streams' load JSON, to import first")
    parser.add_argument("--commit", help="the commit the imported numbers were measured at (default: HEAD)")
    return parser.parse_args(argv)


def parse_engine_table(markdown: str) -> dict[str, Any]:
    """The machine, command, median-round rows and every round's tok/s of bench.engine_throughput's report."""
    lines = markdown.splitlines()
    table = [line for line in lines if line.startswith("|")]
    header = [cell.strip() for cell in table[0].strip("|").split("|")]
    if tuple(header) != COLUMNS:
        raise ValueError(f"not bench.engine_throughput's table: {header}")
    rows = [dict(zip(header, (cell.strip() for cell in line.strip("|").split("|")), strict=True)) for line in table[2:]]
    rounds: dict[str, dict[str, list[float]]] = {}
    for line in lines:  # "- <workload>, <engine>: 480, 470, 490"; the ratio lines have " / " in them
        if line.startswith("- ") and " / " not in line:
            name, values = line[2:].rsplit(": ", 1)
            workload, engine = name.split(", ", 1)
            rounds.setdefault(workload, {})[engine] = [float(value) for value in values.split(", ")]
    return {
        "machine": _field(lines, "Machine: "),
        "command": _field(lines, "Command: ").strip("`"),
        "workload": _field(lines, "Workload: "),
        "rows": [
            {
                "workload": row["workload"],
                "engine": row["engine"],
                "output_tok_s": float(row["output tok/s"]),
                "ttft_p50_ms": float(row["TTFT p50 ms"]),
                "ttft_p99_ms": float(row["TTFT p99 ms"]),
                "itl_p50_ms": float(row["ITL p50 ms"]),
                "same_tokens_as_i": row["same tokens as (i)"],
                "round_tok_s": rounds.get(row["workload"], {}).get(row["engine"], []),
            }
            for row in rows
        ],
    }


def _field(lines: list[str], prefix: str) -> str:
    return next((line[len(prefix) :] for line in lines if line.startswith(prefix)), "")


def head_commit() -> str:
    return subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()


def plot_engine(section: dict[str, Any], out: Path, what: str) -> None:
    workloads = list(dict.fromkeys(row["workload"] for row in section["rows"]))
    engines = list(dict.fromkeys(row["engine"] for row in section["rows"]))
    cells = {(row["workload"], row["engine"]): row for row in section["rows"]}
    fig, ax = plt.subplots(figsize=(10, 5))
    width = 0.8 / len(engines)
    for index, engine in enumerate(engines):
        xs, heights, low, high = [], [], [], []
        for position, workload in enumerate(workloads):
            row = cells.get((workload, engine))
            if row is None:
                continue
            rounds = row["round_tok_s"] or [row["output_tok_s"]]
            xs.append(position + (index - (len(engines) - 1) / 2) * width)
            heights.append(row["output_tok_s"])
            low.append(max(row["output_tok_s"] - min(rounds), 0))
            high.append(max(max(rounds) - row["output_tok_s"], 0))
        bars = ax.bar(xs, heights, width, yerr=[low, high], capsize=3, label=engine)
        ax.bar_label(bars, fmt="%.0f", fontsize=7, padding=2)
    ax.set_xticks(range(len(workloads)), workloads)
    ax.set_ylabel("output tokens/s (median round; whiskers: every round)")
    ax.set_title(f"Engine throughput against HF baselines{what}, measured at {section['commit']}", fontsize=11)
    ax.legend(fontsize=8)
    fig.text(0.01, 0.01, section["machine"], fontsize=7, color="gray")
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    fig.savefig(out, dpi=110, metadata=PNG_METADATA)
    plt.close(fig)


def plot_load(section: dict[str, Any], out: Path) -> None:
    levels = section["levels"]
    streams = [level["streams"] for level in levels]
    medians = [level["median"] for level in levels]
    fig, (ttft_ax, rate_ax) = plt.subplots(1, 2, figsize=(10, 4.5))
    for key, label in (("ttft_p50_ms", "TTFT p50"), ("ttft_p99_ms", "TTFT p99")):
        ttft_ax.plot(streams, [median[key] for median in medians], marker="o", label=label)
    ttft_ax.set_yscale("log")
    ttft_ax.set_ylabel("time to first token, ms (median of rounds)")
    rate_ax.plot(streams, [median["tokens_per_s"] for median in medians], marker="o", color="tab:green")
    rate_ax.set_ylabel("output tokens/s (median of rounds)")
    ttft_ax.legend()
    for ax in (ttft_ax, rate_ax):
        ax.set_xscale("log", base=2)
        ax.set_xticks(streams, [str(level) for level in streams])
        ax.set_xlabel("streamed completions at once")
        ax.grid(alpha=0.3)
    settings = section["settings"]
    fig.suptitle(
        f"Through the service: {settings['output_len']} tokens each, MAX_NUM_SEQS {settings['max_num_seqs']}, "
        f"WORKER_CONCURRENCY {settings['worker_concurrency']}, measured at {section['commit']}",
        fontsize=11,
    )
    fig.text(0.01, 0.01, section["machine"], fontsize=7, color="gray")
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    fig.savefig(out, dpi=110, metadata=PNG_METADATA)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    data = json.loads(args.data.read_text()) if args.data.exists() else {}
    if args.engine_table is not None or args.service_load is not None:
        commit = args.commit or head_commit()
        if args.engine_table is not None:
            data[args.engine_section] = {"commit": commit, **parse_engine_table(args.engine_table.read_text())}
        if args.service_load is not None:
            data["service_load"] = {"commit": commit, **json.loads(args.service_load.read_text())}
        args.data.parent.mkdir(parents=True, exist_ok=True)
        args.data.write_text(json.dumps(data, indent=2) + "\n")
    args.out_dir.mkdir(parents=True, exist_ok=True)
    for name in (name for name in data if name.startswith(ENGINE_SECTION)):
        model = name.removeprefix(ENGINE_SECTION).strip("_")  # engine_throughput_135m: "135m"
        what = f" ({model} model)" if model else ""
        plot_engine(data[name], args.out_dir / f"{name}.png", what)
    if "service_load" in data:
        plot_load(data["service_load"], args.out_dir / LOAD_PLOT)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
