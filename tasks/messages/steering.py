"""JSON-safe steering and monitoring messages: what a request asks for, and what the worker reports back.

The api validates bodies into these, the worker hands them to the engine, and the engine returns the applied
steering (after clamping) and the monitored positions. No torch here: the api imports this module.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, replace
from enum import Enum
from pathlib import PurePosixPath
from typing import Any


class SteeringSource(str, Enum):
    """Where the steering a response reports came from: `steering.source`."""

    REQUEST = "request"  # the request's own `steering`
    TENANT_PROFILE = "tenant_profile"  # the default its tenant set with a user key
    PROFILE = "profile"  # the worker-wide profile an admin set


class MonitorPositions(str, Enum):
    PROMPT = "prompt"  # every prompt token
    COMPLETION = "completion"  # every generated token the model read back (all but the last)
    ALL = "all"
    LAST = "last"  # the last position the model read: the one that produced the final token


@dataclass(frozen=True)
class SteeringFeature:
    index: int
    strength: float

    def to_dict(self) -> dict[str, Any]:
        return {"index": self.index, "strength": self.strength}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SteeringFeature:
        return cls(int(data["index"]), float(data["strength"]))


VECTOR_FILE_SUFFIX = ".safetensors"


def vector_path_problem(path: str) -> str | None:
    """Why `path` cannot name a vector file under the worker's vector root (None if it can): absolute, climbing out
    with `..`, backslashes or NUL, or not a safetensors file. The api refuses such a path with a 400 before queueing;
    whether the file exists only a worker can tell."""
    relative = PurePosixPath(path)
    if not path or "\\" in path or "\0" in path or relative.is_absolute() or ".." in relative.parts:
        return "must be a relative path inside the vector root"
    if relative.suffix != VECTOR_FILE_SUFFIX:
        return f"must name a {VECTOR_FILE_SUFFIX} file"
    return None


@dataclass(frozen=True)
class SteeringVector:
    """A raw (repeng-style) control vector added to the output of decoder layer `layer`, from inline values or a
    safetensors file under the worker's vector root."""

    layer: int
    strength: float = 1.0
    values: tuple[float, ...] | None = None
    path: str | None = None

    def to_dict(self) -> dict[str, Any]:
        values = None if self.values is None else list(self.values)
        return {"layer": self.layer, "strength": self.strength, "values": values, "path": self.path}

    def echo_dict(self) -> dict[str, Any]:
        """What a response shows: the values themselves would repeat the whole vector back."""
        return {"layer": self.layer, "strength": self.strength, "path": self.path}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SteeringVector:
        values = data.get("values")
        return cls(
            layer=int(data["layer"]),
            strength=float(data.get("strength", 1.0)),
            values=None if values is None else tuple(float(value) for value in values),
            path=data.get("path"),
        )


@dataclass(frozen=True)
class SteeringSpec:
    """SAE features at the SAE's hook point, plus raw vectors; no features and no vectors is explicitly unsteered."""

    sae_id: str | None = None
    features: tuple[SteeringFeature, ...] = ()
    vectors: tuple[SteeringVector, ...] = ()

    @property
    def is_steering(self) -> bool:
        return bool(self.features or self.vectors)

    def clamped(self, max_strength: float) -> SteeringSpec:
        """Every strength limited to [-max_strength, max_strength]; non-finite strengths are an input error."""

        def clamp(strength: float) -> float:
            if not math.isfinite(strength):
                raise ValueError(f"steering strength {strength!r} is not a finite number")
            return max(-max_strength, min(max_strength, strength))

        features = tuple(replace(f, strength=clamp(f.strength)) for f in self.features)
        vectors = tuple(replace(v, strength=clamp(v.strength)) for v in self.vectors)
        return replace(self, features=features, vectors=vectors)

    @property
    def key(self) -> str:
        """A digest of the steering state, "" when unsteered: KV computed under one key is valid only for it."""
        if not self.is_steering:
            return ""
        canonical = json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()

    def to_dict(self) -> dict[str, Any]:
        return {
            "sae_id": self.sae_id,
            "features": [feature.to_dict() for feature in self.features],
            "vectors": [vector.to_dict() for vector in self.vectors],
        }

    def echo_dict(self) -> dict[str, Any]:
        return {**self.to_dict(), "vectors": [vector.echo_dict() for vector in self.vectors]}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SteeringSpec:
        return cls(
            sae_id=data.get("sae_id"),
            features=tuple(SteeringFeature.from_dict(item) for item in data.get("features", ())),
            vectors=tuple(SteeringVector.from_dict(item) for item in data.get("vectors", ())),
        )


@dataclass(frozen=True)
class MonitorSpec:
    sae_id: str
    top_k: int = 5
    features: tuple[int, ...] | None = None  # rank only among these
    positions: MonitorPositions = MonitorPositions.ALL

    def max_values(self, num_prompt_tokens: int, max_tokens: int) -> int:
        """The most (feature, value) pairs the report can hold: positions read times top_k."""
        num_read = num_prompt_tokens + max_tokens - 1  # the last generated token is never read
        num_positions = {
            MonitorPositions.PROMPT: num_prompt_tokens,
            MonitorPositions.COMPLETION: num_read - num_prompt_tokens,
            MonitorPositions.ALL: num_read,
            MonitorPositions.LAST: 1,
        }[self.positions]
        return num_positions * self.top_k

    def to_dict(self) -> dict[str, Any]:
        features = None if self.features is None else list(self.features)
        return {"sae_id": self.sae_id, "top_k": self.top_k, "features": features, "positions": self.positions.value}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> MonitorSpec:
        features = data.get("features")
        return cls(
            sae_id=data["sae_id"],
            top_k=int(data.get("top_k", 5)),
            features=None if features is None else tuple(int(index) for index in features),
            positions=MonitorPositions(data.get("positions", MonitorPositions.ALL.value)),
        )


@dataclass(frozen=True)
class MonitoredPosition:
    """One position the model read: its token and the SAE's top features there, largest first."""

    position: int
    token_id: int
    features: tuple[tuple[int, float], ...]  # (feature index, activation)

    def to_dict(self) -> dict[str, Any]:
        return {
            "position": self.position,
            "token_id": self.token_id,
            "features": [{"index": index, "value": value} for index, value in self.features],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> MonitoredPosition:
        features = tuple((int(item["index"]), float(item["value"])) for item in data["features"])
        return cls(int(data["position"]), int(data["token_id"]), features)
