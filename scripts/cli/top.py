"""`python -m scripts.cli.top`: a live terminal view of a running steerbatch, from its /health/ready and /metrics.

Per model: readiness, live workers, queue depth, running and waiting requests, generated tokens per second (counter
deltas between two scrapes), TTFT p50 (from the histogram's buckets: over the window when requests started in it,
else since the workers started) and KV-cache usage; then each worker's heartbeat and load. /metrics needs an admin
key once keys exist: `--api-key` or API_KEY. `--once` prints one frame (two scrapes `--interval` apart) and exits.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import requests
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table

TTFT = "steerbatch:time_to_first_token_seconds"
GENERATION_TOKENS = "steerbatch:generation_tokens_total"


@dataclass(frozen=True)
class Scrape:
    at: float  # monotonic seconds
    ready: dict[str, Any]  # /health/ready's body
    samples: list[Sample]  # every sample of /metrics


def fetch(url: str, api_key: str | None) -> Scrape:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    ready = requests.get(f"{url}/health/ready", timeout=10)
    metrics = requests.get(f"{url}/metrics", headers=headers, timeout=10)
    if metrics.status_code != 200:
        raise SystemExit(f"/metrics answered {metrics.status_code}: {metrics.text.strip()}")
    samples = [sample for family in text_string_to_metric_families(metrics.text) for sample in family.samples]
    return Scrape(time.monotonic(), ready.json(), samples)


def total(samples: Iterable[Sample], name: str, **labels: str) -> float:
    """The sum of `name`'s samples whose labels include `labels` (over workers, say)."""
    return sum(s.value for s in samples if s.name == name and labels.items() <= s.labels.items())


def buckets(samples: Iterable[Sample], name: str, model: str) -> dict[float, float]:
    """A histogram's cumulative bucket counts over a model's workers, by upper bound."""
    counts: dict[float, float] = {}
    for s in samples:
        if s.name == f"{name}_bucket" and s.labels.get("model_name") == model:
            bound = float(s.labels["le"])
            counts[bound] = counts.get(bound, 0.0) + s.value
    return counts


def quantile(cumulative: dict[float, float], q: float) -> float | None:
    """Prometheus' histogram_quantile: linear within the bucket where the rank falls."""
    bounds = sorted(cumulative)
    if not bounds or cumulative[bounds[-1]] <= 0:
        return None
    rank = q * cumulative[bounds[-1]]
    lower, below = 0.0, 0.0
    for bound in bounds:
        if cumulative[bound] >= rank:
            if math.isinf(bound):
                return lower
            width = cumulative[bound] - below
            return lower + (bound - lower) * ((rank - below) / width if width else 0.0)
        lower, below = bound, cumulative[bound]
    return lower


def ttft_p50(before: Scrape, after: Scrape, model: str) -> str:
    now, then = buckets(after.samples, TTFT, model), buckets(before.samples, TTFT, model)
    window = {bound: count - then.get(bound, 0.0) for bound, count in now.items()}
    in_window = quantile(window, 0.5)
    if in_window is not None:
        return f"{in_window * 1000:.0f} ms"
    overall = quantile(now, 0.5)
    return "-" if overall is None else f"{overall * 1000:.0f} ms (all)"


def models_table(before: Scrape, after: Scrape) -> Table:
    table = Table(title="models")
    for column in ("model", "status", "workers", "queue i/b", "running", "waiting i/b", "tokens/s", "TTFT p50", "KV"):
        table.add_column(column)
    elapsed = max(after.at - before.at, 1e-9)
    for name, model in after.ready.get("models", {}).items():
        generated = total(after.samples, GENERATION_TOKENS, model_name=name)
        rate = (generated - total(before.samples, GENERATION_TOKENS, model_name=name)) / elapsed
        queue, waiting = model["queue_depth"], model["num_requests_waiting"]
        table.add_row(
            name,
            model["status"],
            str(len(model["workers"])),
            f"{queue.get('interactive', 0)}/{queue.get('bulk', 0)}",
            str(model["num_requests_running"]),
            f"{waiting.get('interactive', 0)}/{waiting.get('bulk', 0)}",
            f"{max(rate, 0.0):.1f}",
            ttft_p50(before, after, name),
            f"{model['kv_cache_usage']:.0%}",
        )
    return table


def workers_table(scrape: Scrape) -> Table:
    table = Table(title="workers")
    for column in ("worker", "model", "heartbeat", "running", "waiting i/b", "KV"):
        table.add_column(column)
    for name, model in scrape.ready.get("models", {}).items():
        for worker in model["workers"]:
            waiting = worker["num_requests_waiting"]
            table.add_row(
                worker["name"],
                name,
                f"{worker['heartbeat_age_s']:.1f} s ago",
                str(worker["num_requests_running"]),
                f"{waiting.get('interactive', 0)}/{waiting.get('bulk', 0)}",
                f"{worker['kv_cache_usage']:.0%}",
            )
    return table


def frame(before: Scrape, after: Scrape) -> Group:
    return Group(models_table(before, after), workers_table(after))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default=os.environ.get("STEERBATCH_URL", "http://127.0.0.1:8000"))
    parser.add_argument("--api-key", default=os.environ.get("API_KEY"), help="an admin key (default: API_KEY)")
    interval_help = "seconds between scrapes (workers publish every WORKER_LEASE_S / 3)"
    parser.add_argument("--interval", type=float, default=5.0, help=interval_help)
    parser.add_argument("--once", action="store_true", help="print one frame and exit")
    args = parser.parse_args(argv)
    url = args.url.rstrip("/")
    before = fetch(url, args.api_key)
    time.sleep(args.interval)
    after = fetch(url, args.api_key)
    if args.once:
        Console().print(frame(before, after))
        return
    with Live(frame(before, after), refresh_per_second=1) as live:
        while True:
            time.sleep(args.interval)
            before, after = after, fetch(url, args.api_key)
            live.update(frame(before, after))


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C ends the live view
        main()
