"""The `steering` and `monitor` body fields (chat, completions, batch lines, the steering profile and the worker-wide
monitor), validated with pydantic; what needs the SAE listing (known ids, index < d_sae) is checked in
api.steering.specs."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from tasks.messages.steering import (
    MonitorPositions,
    MonitorSpec,
    SteeringFeature,
    SteeringSpec,
    SteeringVector,
    vector_path_problem,
)

MAX_STEERING_FEATURES = 64
MAX_STEERING_VECTORS = 16
MAX_VECTOR_VALUES = 65536
# A raw vector's entries, whose product with a strength (clamped at STEERING_MAX_STRENGTH) must stay finite in the
# model's dtype: a residual stream's entries are rarely beyond a few hundred.
MAX_VECTOR_VALUE = 1e4
MAX_MONITOR_FEATURES = 1024
MAX_SAE_ID_LENGTH = 256


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, strict=True)  # as StrictModel: no coercion


class SteeringFeatureBody(_Strict):
    index: int = Field(ge=0)
    strength: float


class SteeringVectorBody(_Strict):
    layer: int = Field(ge=0)
    strength: float = 1.0
    values: list[Annotated[float, Field(ge=-MAX_VECTOR_VALUE, le=MAX_VECTOR_VALUE)]] | None = Field(
        None, min_length=1, max_length=MAX_VECTOR_VALUES
    )
    path: str | None = Field(None, min_length=1, max_length=MAX_SAE_ID_LENGTH)

    @field_validator("path")
    @classmethod
    def _inside_the_vector_root(cls, path: str | None) -> str | None:
        problem = None if path is None else vector_path_problem(path)
        if problem is not None:
            raise ValueError(f"steering vector path {path!r} {problem}")
        return path

    @model_validator(mode="after")
    def _one_source(self) -> SteeringVectorBody:
        if (self.values is None) == (self.path is None):
            raise ValueError("a steering vector needs exactly one of values and path")
        return self


class SteeringBody(_Strict):
    sae_id: str | None = Field(None, min_length=1, max_length=MAX_SAE_ID_LENGTH)
    features: list[SteeringFeatureBody] = Field(default_factory=list, max_length=MAX_STEERING_FEATURES)
    vectors: list[SteeringVectorBody] = Field(default_factory=list, max_length=MAX_STEERING_VECTORS)

    @field_validator("features")
    @classmethod
    def _distinct(cls, features: list[SteeringFeatureBody]) -> list[SteeringFeatureBody]:
        indices = [feature.index for feature in features]
        if len(set(indices)) != len(indices):
            raise ValueError("each feature index may appear only once")
        return features

    @model_validator(mode="after")
    def _features_need_an_sae(self) -> SteeringBody:
        if self.features and self.sae_id is None:
            raise ValueError("steering features need an sae_id")
        return self

    def to_spec(self) -> SteeringSpec:
        return SteeringSpec(
            sae_id=self.sae_id,
            features=tuple(SteeringFeature(f.index, f.strength) for f in self.features),
            vectors=tuple(
                SteeringVector(v.layer, v.strength, None if v.values is None else tuple(v.values), v.path)
                for v in self.vectors
            ),
        )


class MonitorBody(_Strict):
    sae_id: str = Field(min_length=1, max_length=MAX_SAE_ID_LENGTH)
    top_k: int = Field(5, ge=1)
    features: list[int] | None = Field(None, min_length=1, max_length=MAX_MONITOR_FEATURES)
    positions: Literal["prompt", "completion", "all", "last"] = "all"

    @field_validator("features")
    @classmethod
    def _distinct(cls, features: list[int] | None) -> list[int] | None:
        if features is not None and (len(set(features)) != len(features) or min(features) < 0):
            raise ValueError("monitor features must be distinct non-negative indices")
        return features

    def to_spec(self) -> MonitorSpec:
        features = None if self.features is None else tuple(self.features)
        return MonitorSpec(self.sae_id, self.top_k, features, MonitorPositions(self.positions))


class WorkerMonitorBody(_Strict):
    """PUT /v1/monitor: which features the worker-wide monitor follows."""

    sae_id: str = Field(min_length=1, max_length=MAX_SAE_ID_LENGTH)
    features: list[int] = Field(min_length=1, max_length=MAX_MONITOR_FEATURES)

    @field_validator("features")
    @classmethod
    def _distinct(cls, features: list[int]) -> list[int]:
        if len(set(features)) != len(features) or min(features) < 0:
            raise ValueError("monitor features must be distinct non-negative indices")
        return features
