"""What the prefix cache's bookkeeping costs when nothing hits: the unshared workload of
`bench.features.prefix_cache` (every prompt distinct, all at t=0), cache on and off, timing every call into the
`BlockManager` (hashing full blocks, lookups, reference counts, eviction) against the engine's wall time.

End-to-end throughput on a shared 2-core machine varies by more than the 3 % the cache may cost; the time spent
inside the block manager does not depend on that noise, and bounds what the cache can cost.

    .venv/bin/python -m bench.features.prefix_cache_overhead --model models/tiny [--threads 1] [--repeats 3]

(the same options as bench.features.prefix_cache, whose unshared workload it runs)
"""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Callable
from typing import Any

from bench.engine_throughput import machine_description
from bench.features.prefix_cache import cache_on_and_off, parse_args, run_once, workloads
from scheduler.block_manager import BlockManager

TIMED_METHODS = ("can_allocate", "allocate", "free", "reuse_cached_prefix", "cache_full_blocks", "num_missing_blocks")


class BlockManagerClock:
    """Seconds spent inside the timed BlockManager methods, by wrapping them on the class."""

    def __init__(self) -> None:
        self.seconds = 0.0
        for name in TIMED_METHODS:
            setattr(BlockManager, name, self._timed(getattr(BlockManager, name)))

    def _timed(self, method: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(method)
        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - started

        return timed


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv, description=__doc__)
    runner, configs = cache_on_and_off(args)
    requests = workloads(args, runner.model.config.vocab_size)["unshared"]
    clock = BlockManagerClock()
    rows: dict[str, list[tuple[float, float]]] = {name: [] for name in configs}
    for _ in range(args.repeats):
        for name, engine_config in configs.items():
            clock.seconds = 0.0
            summary = run_once(runner, engine_config, "unshared", requests)
            rows[name].append((summary.wall_s, clock.seconds))
    print(f"Machine: {machine_description(args)}\n")
    num_tokens = args.system_len + 40
    print(f"unshared: {len(requests)} distinct prompts of ~{num_tokens} tokens, all at t=0; {args.repeats} runs each\n")
    print("| cache | wall s (median) | block manager s (median) | share of wall |")
    print("|---|---|---|---|")
    for name, measured in rows.items():
        wall = statistics.median(wall for wall, _ in measured)
        inside = statistics.median(seconds for _, seconds in measured)
        print(f"| {name} | {wall:.2f} | {inside:.4f} | {inside / wall:.2%} |")
    extra = statistics.median(s for _, s in rows["cache on"]) - statistics.median(s for _, s in rows["cache off"])
    wall_off = statistics.median(wall for wall, _ in rows["cache off"])
    print(f"\nthe cache's own bookkeeping: {extra:.4f} s, {extra / wall_off:.2%} of the cache-off wall time")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
