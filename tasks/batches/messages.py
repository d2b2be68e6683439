"""JSON-safe dataclasses of the Batch API that cross process boundaries: chunk tasks and progress events."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from enum import Enum
from typing import Any

from tasks.messages.generation import GenerateRequest


@dataclass(frozen=True)
class ChunkTask:
    """What the bulk queue carries: which chunk of which batch to run; the lines themselves are in SQL."""

    batch_id: str
    chunk_id: str
    model: str  # the batch's model: the chunk goes to its bulk queue

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ChunkTask:
        return cls(batch_id=data["batch_id"], chunk_id=data["chunk_id"], model=data["model"])


@dataclass(frozen=True)
class ResponseLine:
    """A /v1/responses batch line: the chat request it runs as (what the worker reads of the ledger row), and what
    its output line's response object shows besides the result."""

    generate: GenerateRequest
    response_id: str
    instructions: str | None
    input_items: list[dict[str, Any]]
    params: dict[str, Any]  # what the response object echoes of its request

    @property
    def request_id(self) -> str:
        return self.generate.request_id

    @property
    def model(self) -> str:
        return self.generate.model

    @property
    def num_prompt_tokens(self) -> int:
        return self.generate.num_prompt_tokens

    def to_dict(self) -> dict[str, Any]:
        response = {"id": self.response_id, "instructions": self.instructions, "input_items": self.input_items}
        return {**self.generate.to_dict(), "response": {**response, "params": self.params}}


@dataclass(frozen=True)
class RequestCounts:
    total: int
    completed: int
    failed: int  # failed, cancelled and expired lines: at the end completed + failed == total

    def to_dict(self) -> dict[str, int]:
        return {"total": self.total, "completed": self.completed, "failed": self.failed}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RequestCounts:
        return cls(total=int(data["total"]), completed=int(data["completed"]), failed=int(data["failed"]))


class BatchEventType(str, Enum):
    STATUS = "status"  # the batch changed status
    LINE = "line"  # one line reached its terminal status


@dataclass(frozen=True)
class BatchEvent:
    """One entry of a batch's progress stream."""

    type: BatchEventType
    status: str  # the batch's status
    request_counts: RequestCounts
    line_no: int | None = None
    custom_id: str | None = None
    line_status: str | None = None

    def to_dict(self) -> dict[str, Any]:
        # field by field: dataclasses.asdict deep-copies, and a worker builds one of these per finished line
        return {
            "type": self.type.value,
            "status": self.status,
            "request_counts": self.request_counts.to_dict(),
            "line_no": self.line_no,
            "custom_id": self.custom_id,
            "line_status": self.line_status,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BatchEvent:
        return cls(
            type=BatchEventType(data["type"]),
            status=data["status"],
            request_counts=RequestCounts.from_dict(data["request_counts"]),
            line_no=data.get("line_no"),
            custom_id=data.get("custom_id"),
            line_status=data.get("line_status"),
        )
