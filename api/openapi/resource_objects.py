"""The other routes' response objects as pydantic models, for the OpenAPI document only (the views build them as
dicts: api/batches/file_objects.py, api/batches/batch_objects.py, the blueprints)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field


class Model(BaseModel):
    id: str
    object: Literal["model"]
    created: int
    owned_by: str
    max_model_len: int


class ModelList(BaseModel):
    object: Literal["list"]
    data: list[Model]


class FileObject(BaseModel):
    id: str
    object: Literal["file"]
    bytes: int
    created_at: int
    filename: str
    purpose: Literal["batch", "batch_output"] = Field(description="batch_output: a batch's output or error file")
    status: Literal["processed"]
    status_details: None
    expires_at: int | None = Field(description="when it expires (expires_after, a batch's output_expires_after)")


class FileList(BaseModel):
    object: Literal["list"]
    data: list[FileObject]
    first_id: str | None
    last_id: str | None
    has_more: bool


class FileDeleted(BaseModel):
    id: str
    object: Literal["file"]
    deleted: Literal[True]


class FileUpload(BaseModel):
    """The multipart form of POST /v1/files."""

    file: bytes = Field(json_schema_extra={"format": "binary"}, description="a JSONL file of batch request lines")
    purpose: Literal["batch"]


class BatchError(BaseModel):
    code: str | None
    message: str
    param: str | None
    line: int | None


class BatchErrors(BaseModel):
    object: Literal["list"]
    data: list[BatchError]


class RequestCounts(BaseModel):
    total: int
    completed: int
    failed: int


class Batch(BaseModel):
    id: str
    object: Literal["batch"]
    endpoint: str
    model: str
    errors: BatchErrors | None
    input_file_id: str
    completion_window: str
    status: Literal[
        "validating", "failed", "in_progress", "finalizing", "completed", "expired", "cancelling", "cancelled"
    ]
    output_file_id: str | None
    error_file_id: str | None
    created_at: int
    in_progress_at: int | None
    expires_at: int | None
    finalizing_at: int | None
    completed_at: int | None
    failed_at: int | None
    expired_at: int | None
    cancelling_at: int | None
    cancelled_at: int | None
    request_counts: RequestCounts
    metadata: dict[str, str] | None


class BatchList(BaseModel):
    object: Literal["list"]
    data: list[Batch]
    first_id: str | None
    last_id: str | None
    has_more: bool


class Sae(BaseModel):
    id: str
    object: Literal["sae"]
    hook_name: str
    d_in: int
    d_sae: int
    architecture: str


class SaeList(BaseModel):
    object: Literal["list"]
    data: list[Sae]


class SteeringFeature(BaseModel):
    index: int
    strength: float


class SteeringVector(BaseModel):
    layer: int
    strength: float
    values: list[float] | None
    path: str | None


class SteeringProfile(BaseModel):
    sae_id: str | None
    features: list[SteeringFeature]
    vectors: list[SteeringVector]


class SteeringProfileObject(BaseModel):
    object: Literal["steering.profile"]
    scope: Literal["tenant", "worker"]
    tenant: str | None = Field(description="the tenant whose profile this is; null for the worker-wide one")
    profile: SteeringProfile | None


class MonitorSettings(BaseModel):
    id: str
    sae_id: str
    features: list[int]


class FeatureStats(BaseModel):
    index: int
    mean: float
    max: float
    frequency: float = Field(description="the share of monitored tokens on which the feature was active")


class WorkerMonitorStats(BaseModel):
    """One live worker's running statistics of the monitored features since the settings last changed."""

    worker: str
    sae_id: str
    count: int = Field(description="tokens seen")
    features: list[FeatureStats]
    settings: MonitorSettings | None


class Monitor(BaseModel):
    object: Literal["monitor"]
    settings: MonitorSettings | None
    workers: list[WorkerMonitorStats]


class BatchEvent(BaseModel):
    """One `data:` event of a batch's progress stream; it ends with `data: [DONE]` after the batch's last status."""

    type: Literal["status", "line"]
    status: str = Field(description="the batch's status")
    request_counts: RequestCounts
    line_no: int | None = Field(description="line events: the input line that finished")
    custom_id: str | None
    line_status: str | None
