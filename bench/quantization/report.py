"""The quantization benchmark's rows: one markdown table, and a plot of decode speed and KL per variant."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Row:
    model: str
    weights: str  # the variant: "none", a QUANTIZATION load-time method or a compressed-tensors preset
    kv_cache_dtype: str
    weight_mib: float
    kv_bytes_per_token: int  # codes and scales of every layer, K and V
    tokens_per_s: dict[int, float]  # decode tokens/s by concurrent requests
    greedy_agreement: float  # 0 to 1
    mean_kl: float  # nats
    perplexity: float | None  # the tiny model's, on held-out text

    @property
    def label(self) -> str:
        weights = "float32" if self.weights == "none" else self.weights
        return weights if self.kv_cache_dtype == "float32" else f"KV {self.kv_cache_dtype}"


def format_table(rows: list[Row]) -> str:
    concurrencies = sorted({c for row in rows for c in row.tokens_per_s})
    baseline = {row.model: row for row in rows if row.weights == "none" and row.kv_cache_dtype == "float32"}
    head = ["model", "weights", "KV", "weights MiB", "KV bytes/token"]
    head += [f"decode tok/s @{c} (x float32)" for c in concurrencies]
    head += ["greedy agreement", "mean KL (nats)", "perplexity"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        base = baseline.get(row.model)
        speeds = [
            f"{row.tokens_per_s[c]:.1f} ({row.tokens_per_s[c] / base.tokens_per_s[c]:.2f}x)" if base else "-"
            for c in concurrencies
        ]
        cells = [row.model, row.weights, row.kv_cache_dtype, f"{row.weight_mib:.1f}", str(row.kv_bytes_per_token)]
        cells += speeds
        cells += [
            f"{row.greedy_agreement:.1%}",
            f"{row.mean_kl:.2e}",
            "-" if row.perplexity is None else f"{row.perplexity:.3f}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot_rows(rows: list[Row], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = sorted({row.model for row in rows}, key=[row.model for row in rows].index)
    concurrencies = sorted({c for row in rows for c in row.tokens_per_s})
    figure, axes = plt.subplots(len(models), 2, figsize=(13, 4 * len(models)), squeeze=False)
    for line, model in zip(axes, models, strict=True):
        chosen = [row for row in rows if row.model == model]
        labels = [row.label for row in chosen]
        width = 0.8 / len(concurrencies)
        for i, concurrency in enumerate(concurrencies):
            positions = [x + i * width for x in range(len(chosen))]
            line[0].bar(positions, [row.tokens_per_s[concurrency] for row in chosen], width, label=f"{concurrency}")
        line[0].set_xticks([x + width * (len(concurrencies) - 1) / 2 for x in range(len(chosen))], labels, rotation=35,
                           ha="right", fontsize=8)  # fmt: skip
        line[0].set_ylabel("decode tokens/s")
        line[0].set_title(f"{model}: decode tokens/s by concurrent requests")
        line[0].legend(title="requests")
        compared = [row for row in chosen if row.mean_kl > 0]  # the baseline is its own reference
        line[1].bar(range(len(compared)), [row.mean_kl for row in compared], color="tab:red")
        line[1].set_yscale("log")
        line[1].set_xticks(range(len(compared)), [row.label for row in compared], rotation=35, ha="right", fontsize=8)
        line[1].set_ylabel("mean KL vs float32 (nats)")
        line[1].set_title(f"{model}: next-token KL against float32 weights and KV")
    figure.tight_layout()
    figure.savefig(out, dpi=110)
