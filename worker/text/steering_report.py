"""What a request's response reports about steering and monitoring, gathered from its engine outputs."""

from __future__ import annotations

from typing import Any

from transformers import PreTrainedTokenizerFast

from tasks.messages.steering import MonitoredPosition, MonitorPositions, MonitorSpec, SteeringSource, SteeringSpec
from worker.engine.interface import EngineOutput


class SteeringReport:
    """Follows one engine request (a request's first choice): the steering it ran and the positions it monitored."""

    def __init__(self, engine_request_id: str, monitor: MonitorSpec | None, source: SteeringSource) -> None:
        self.engine_request_id = engine_request_id
        self._monitor = monitor
        self._source = source
        self._steering: SteeringSpec | None = None
        self._positions: list[MonitoredPosition] = []

    def add(self, output: EngineOutput) -> None:
        if output.request_id != self.engine_request_id:
            return
        if output.steering is not None:
            self._steering = output.steering
        self._positions.extend(output.monitor)
        if self._monitor is not None and self._monitor.positions is MonitorPositions.LAST:
            del self._positions[:-1]

    @property
    def is_steered(self) -> bool:
        """Whether features or vectors ran (an explicitly empty spec is reported, but steers nothing)."""
        return self._steering is not None and self._steering.is_steering

    def steering(self) -> dict[str, Any] | None:
        return None if self._steering is None else {**self._steering.echo_dict(), "source": self._source.value}

    def monitor(self, tokenizer: PreTrainedTokenizerFast) -> dict[str, Any] | None:
        if self._monitor is None:
            return None
        tokens = tokenizer.convert_ids_to_tokens([position.token_id for position in self._positions])
        return {
            **self._monitor.to_dict(),
            "tokens": [
                {**position.to_dict(), "token": tokenizer.convert_tokens_to_string([token])}
                for position, token in zip(self._positions, tokens, strict=True)
            ],
        }
