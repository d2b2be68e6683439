"""What bench/gpu.py reports beside its table: batch-1 decode against the HBM roofline (the weights' bytes per step
over a measured device-to-device copy bandwidth), and the issue's targets, each met or missed."""

from __future__ import annotations

import time

import torch
from transformers import PreTrainedModel

from bench.metrics import Summary

COPY_BYTES = {"cuda": 2**30, "cpu": 2**27}  # per copy: far past the caches


def copy_bandwidth(device: torch.device) -> float:
    """Bytes per second of a large device-to-device copy, counting bytes read and bytes written (median of 10)."""
    source = torch.randn(COPY_BYTES[device.type] // 4, device=device)
    target = torch.empty_like(source)
    times = []
    for _ in range(12):
        synchronize(device)
        started = time.perf_counter()
        target.copy_(source)
        synchronize(device)
        times.append(time.perf_counter() - started)
    del source, target
    return 2 * COPY_BYTES[device.type] / sorted(times[2:])[len(times[2:]) // 2]


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def weight_bytes_per_step(model: PreTrainedModel) -> int:
    """Bytes of weights one decode step reads: every parameter once (tied embeddings once, as the LM head), except
    an untied input embedding, of which a step reads only its tokens' rows."""
    total = sum(parameter.numel() * parameter.element_size() for parameter in model.parameters())
    embedding, head = model.get_input_embeddings().weight, model.get_output_embeddings().weight
    if embedding.data_ptr() != head.data_ptr():
        total -= embedding.numel() * embedding.element_size()
    return total


def find(summaries: list[Summary], workload: str, key: str) -> Summary | None:
    return next((s for s in summaries if s.workload == workload and s.engine_key == key), None)


def roofline_lines(summaries: list[Summary], weight_bytes: int, bandwidth: float) -> list[str]:
    """Batch-1 decode (1 / ITL p50) of each engine as a fraction of the rate at which the device could read the
    weights once per token (the KV cache's few MB per step left out)."""
    roofline = bandwidth / weight_bytes  # tokens/s
    lines = [
        f"HBM roofline at batch 1: {weight_bytes / 1e9:.3f} GB of weights per step over {bandwidth / 1e9:.0f} GB/s "
        f"(a measured device-to-device copy, bytes read + written) = {roofline:.0f} tok/s"
    ]
    for summary in (s for s in summaries if s.workload == "batch 1"):
        decode_rate = 1e3 / summary.itl_p50_ms
        lines.append(
            f"- {summary.engine_label}: batch-1 decode {decode_rate:.0f} tok/s (ITL p50 {summary.itl_p50_ms:.2f} ms),"
            f" {decode_rate / roofline:.0%} of the roofline"
        )
    return lines


def target_lines(summaries: list[Summary], weight_bytes: int, bandwidth: float) -> list[str]:
    """The issue's targets, measured: each 'met' or 'missed', or 'not measured' when an engine is missing."""
    graphs, eager = find(summaries, "batch 1", "steerbatch_graphs"), find(summaries, "batch 1", "steerbatch")
    ours_64, static_64 = find(summaries, "batch 64", "steerbatch_graphs"), find(summaries, "batch 64", "static")
    roofline = bandwidth / weight_bytes
    checks = [  # (target, measured or None, the least that meets it, format)
        ("batch-1 decode at 70% of the HBM roofline", graphs and 1e3 / graphs.itl_p50_ms / roofline, 0.7, "{:.0%}"),
        (
            "batch 64: ours with graphs 3x HF static cache",
            ours_64 and static_64 and ratio(ours_64, static_64),
            3.0,
            "{:.2f}x",
        ),
        ("batch 1: ours with graphs 2x ours eager", graphs and eager and ratio(graphs, eager), 2.0, "{:.2f}x"),
    ]
    lines = ["Targets:"]
    for name, value, least, form in checks:
        verdict = "not measured" if not value else f"{form.format(value)}, {'met' if value >= least else 'missed'}"
        lines.append(f"- {name}: {verdict}")
    return lines


def ratio(ours: Summary, theirs: Summary) -> float:
    return ours.tokens_per_s / theirs.tokens_per_s
