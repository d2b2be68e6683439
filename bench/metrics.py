"""Per-request token timestamps, measured the same way for every engine, and the table built from them.

All times are `time.perf_counter()` seconds. A request's arrival is the workload's start plus its nominal arrival
offset, so TTFT includes any wait before an engine takes it. Throughput is useful output tokens (each request's own
`num_output_tokens`) over the wall time from the first arrival to the last token of the workload.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

NAIVE_KEY = "naive"
STATIC_KEY = "static"
COLUMNS = (
    "workload",
    "engine",
    "requests",
    "useful tokens",
    "generated tokens",
    "wall s",
    "output tok/s",
    "TTFT p50 ms",
    "TTFT p99 ms",
    "ITL p50 ms",
    "ITL p99 ms",
    "x (i)",
    "x (ii)",
    "same tokens as (i)",
)


@dataclass(frozen=True)
class RequestTrace:
    request_id: str
    arrival: float
    token_ids: list[int]
    token_times: list[float]  # one per token in token_ids


@dataclass(frozen=True)
class RunResult:
    engine_key: str
    engine_label: str
    workload: str
    start: float  # the workload's t=0, the first arrival
    traces: list[RequestTrace]
    num_generated_tokens: int  # tokens the engine computed, useful or not (static batching runs rows past their end)


@dataclass(frozen=True)
class Summary:
    engine_key: str
    engine_label: str
    workload: str
    num_requests: int
    num_useful_tokens: int
    num_generated_tokens: int
    wall_s: float
    tokens_per_s: float
    ttft_p50_ms: float
    ttft_p99_ms: float
    itl_p50_ms: float
    itl_p99_ms: float
    num_same_as_naive: int | None  # None: no naive run to compare with


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile with linear interpolation between order statistics (numpy's default)."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = q / 100 * (len(ordered) - 1)
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def summarize(result: RunResult, naive_token_ids: dict[str, list[int]] | None) -> Summary:
    traces = result.traces
    ttfts = [trace.token_times[0] - trace.arrival for trace in traces if trace.token_times]
    itls = [
        later - earlier
        for trace in traces
        for earlier, later in zip(trace.token_times, trace.token_times[1:], strict=False)
    ]
    num_useful_tokens = sum(len(trace.token_ids) for trace in traces)
    wall_s = max(trace.token_times[-1] for trace in traces if trace.token_times) - result.start
    num_same = None
    if naive_token_ids is not None:
        num_same = sum(trace.token_ids == naive_token_ids.get(trace.request_id) for trace in traces)
    return Summary(
        engine_key=result.engine_key,
        engine_label=result.engine_label,
        workload=result.workload,
        num_requests=len(traces),
        num_useful_tokens=num_useful_tokens,
        num_generated_tokens=result.num_generated_tokens,
        wall_s=wall_s,
        tokens_per_s=num_useful_tokens / wall_s,
        ttft_p50_ms=percentile(ttfts, 50) * 1e3,
        ttft_p99_ms=percentile(ttfts, 99) * 1e3,
        itl_p50_ms=percentile(itls, 50) * 1e3,
        itl_p99_ms=percentile(itls, 99) * 1e3,
        num_same_as_naive=num_same,
    )


def format_table(summaries: list[Summary]) -> str:
    """A markdown table, one row per engine and workload, with throughput ratios to (i) and (ii) of its workload."""
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "|".join("---" for _ in COLUMNS) + "|"]
    for summary in summaries:
        lines.append("| " + " | ".join(_row(summary, summaries)) + " |")
    return "\n".join(lines)


def _row(summary: Summary, summaries: list[Summary]) -> list[str]:
    same = "n/a" if summary.num_same_as_naive is None else f"{summary.num_same_as_naive}/{summary.num_requests}"
    return [
        summary.workload,
        summary.engine_label,
        str(summary.num_requests),
        str(summary.num_useful_tokens),
        str(summary.num_generated_tokens),
        f"{summary.wall_s:.2f}",
        f"{summary.tokens_per_s:.1f}",
        f"{summary.ttft_p50_ms:.0f}",
        f"{summary.ttft_p99_ms:.0f}",
        f"{summary.itl_p50_ms:.1f}",
        f"{summary.itl_p99_ms:.1f}",
        _ratio(summary, summaries, NAIVE_KEY),
        _ratio(summary, summaries, STATIC_KEY),
        same,
    ]


def _ratio(summary: Summary, summaries: list[Summary], baseline_key: str) -> str:
    for baseline in summaries:
        if baseline.engine_key == baseline_key and baseline.workload == summary.workload:
            return f"{summary.tokens_per_s / baseline.tokens_per_s:.2f}x"
    return "—"
