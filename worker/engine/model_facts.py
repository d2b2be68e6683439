"""How a worker's engine holds its model: what the worker publishes about it and its metrics read, whether the engine
runs in the worker's process or in one of its own."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from worker.engine.continuous_engine import ContinuousEngine
    from worker.engine.model_runner import ModelRunner


@dataclass(frozen=True)
class ModelFacts:
    quantization: str  # the loaded method's name, "none" for float weights
    kv_cache_dtype: str
    kv_cache_tokens: int
    num_blocks: int
    block_size: int

    @classmethod
    def of(cls, runner: ModelRunner, engine: ContinuousEngine) -> ModelFacts:
        return cls(
            runner.quantization.name,
            runner.kv_cache_dtype_name,
            runner.kv_pool.num_tokens,
            engine.num_blocks,
            engine.block_size,
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelFacts:
        return cls(**data)
