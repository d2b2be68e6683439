"""Counters of what the engine ran, and its load now, for tests, logs and the worker's published metrics."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any


@dataclass
class EngineStats:
    num_steps: int = 0  # forward passes
    num_prefill_tokens: int = 0
    num_decode_tokens: int = 0
    num_preemptions: int = 0
    prefix_cache_queried_blocks: int = 0
    prefix_cache_hit_blocks: int = 0
    num_proposed_tokens: int = 0  # speculative decoding
    num_accepted_tokens: int = 0
    num_verifications: int = 0  # steps in which a request verified proposed tokens
    max_batch_size_seen: int = 0  # requests in one forward pass
    batch_size_histogram: dict[int, int] = field(default_factory=dict)  # requests in a forward pass -> passes

    def record_step(self, num_requests: int, num_decode_tokens: int, num_tokens: int) -> None:
        self.num_steps += 1
        self.num_decode_tokens += num_decode_tokens
        self.num_prefill_tokens += num_tokens - num_decode_tokens
        self.max_batch_size_seen = max(self.max_batch_size_seen, num_requests)
        self.batch_size_histogram[num_requests] = self.batch_size_histogram.get(num_requests, 0) + 1

    def snapshot(self) -> EngineStats:
        return dataclasses.replace(self, batch_size_histogram=dict(self.batch_size_histogram))

    def to_dict(self) -> dict[str, Any]:
        return {
            **dataclasses.asdict(self),
            "batch_size_histogram": {str(k): v for k, v in self.batch_size_histogram.items()},
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EngineStats:
        histogram = {int(size): count for size, count in data["batch_size_histogram"].items()}
        return cls(**{**data, "batch_size_histogram": histogram})


@dataclass(frozen=True)
class EngineLoad:
    num_running: int  # requests in the batch
    num_waiting_by_priority: dict[int, int]  # requests waiting for room in the batch or the KV pool
    num_free_blocks: int  # KV blocks no request holds (cached prefixes included: they are reclaimable)
    num_blocks: int

    def to_dict(self) -> dict[str, Any]:
        waiting = {str(priority): count for priority, count in self.num_waiting_by_priority.items()}
        return {**dataclasses.asdict(self), "num_waiting_by_priority": waiting}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EngineLoad:
        waiting = {int(priority): count for priority, count in data["num_waiting_by_priority"].items()}
        return cls(data["num_running"], waiting, data["num_free_blocks"], data["num_blocks"])

    @property
    def kv_cache_usage(self) -> float:
        """vLLM's kv_cache_usage_perc: the fraction of blocks held by requests, 0 to 1."""
        return 1.0 - self.num_free_blocks / self.num_blocks if self.num_blocks else 0.0
