"""What an SAE is, parsed from the `cfg.json` SAELens writes next to `sae_weights.safetensors`.

SAELens 6 writes the architecture's fields at the top level and where the SAE was trained (`hook_name`,
`model_name`, `sae_lens_version`) under `metadata`; releases before 6 are flat, may call the hook
`hook_point`, may leave `architecture` out (standard) and keep a top-k SAE's k in `activation_fn_kwargs`.
Stdlib only, so the listing side can read configs without torch.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CFG_FILENAME = "cfg.json"
WEIGHTS_FILENAME = "sae_weights.safetensors"
ARCHITECTURES = ("standard", "topk", "jumprelu")
# "expected_average_only_in" is absent on purpose: its scaling factor is not in cfg.json (SAELens keeps it in
# its release table or folds it into the weights), so an SAE that still asks for it cannot be run faithfully.
NORMALIZATIONS = ("none", "constant_norm_rescale", "layer_norm")


@dataclass(frozen=True)
class SAEConfig:
    d_in: int
    d_sae: int
    hook_name: str
    architecture: str = "standard"
    apply_b_dec_to_input: bool = True
    normalize_activations: str = "none"
    k: int | None = None  # topk only: features kept per token
    rescale_acts_by_decoder_norm: bool = False  # topk only
    dtype: str = "float32"
    model_name: str = ""

    def __post_init__(self) -> None:
        for name in ("d_in", "d_sae"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"SAE config: {name} must be a positive integer, got {value!r}")
        if self.architecture not in ARCHITECTURES:
            raise ValueError(
                f"SAE config: architecture {self.architecture!r} is not supported (one of {', '.join(ARCHITECTURES)})"
            )
        if self.normalize_activations not in NORMALIZATIONS:
            raise ValueError(
                f"SAE config: normalize_activations {self.normalize_activations!r} is not supported "
                f"(one of {', '.join(NORMALIZATIONS)}; fold any expected-average scaling into the weights first)"
            )
        if self.architecture == "topk" and not (isinstance(self.k, int) and 0 < self.k <= self.d_sae):
            raise ValueError(f"SAE config: a topk SAE needs k in [1, d_sae={self.d_sae}], got {self.k!r}")
        if not isinstance(self.hook_name, str) or not self.hook_name:
            raise ValueError("SAE config: hook_name is missing (top level, or under metadata)")

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> SAEConfig:
        """Parses either SAELens layout; raises ValueError naming what is missing or unsupported."""
        if not isinstance(raw, Mapping):
            raise ValueError("SAE config: cfg.json must hold a JSON object")
        metadata = raw.get("metadata") if isinstance(raw.get("metadata"), Mapping) else {}
        fields: dict[str, Any] = {
            "d_in": _require(raw, "d_in"),
            "d_sae": _require(raw, "d_sae"),
            "hook_name": _first(raw, metadata, "hook_name", "hook_point") or "",
            "architecture": _read_architecture(raw, metadata),
            "apply_b_dec_to_input": bool(_first(raw, metadata, "apply_b_dec_to_input", default=True)),
            "normalize_activations": _read_normalization(raw.get("normalize_activations")),
            "k": _read_k(raw),
            "rescale_acts_by_decoder_norm": bool(raw.get("rescale_acts_by_decoder_norm", False)),
            "dtype": str(raw.get("dtype") or "float32"),
            "model_name": str(_first(raw, metadata, "model_name") or ""),
        }
        if fields["architecture"] != "topk":
            fields["k"] = None
        return cls(**fields)

    @classmethod
    def read(cls, folder: Path) -> SAEConfig:
        path = folder / CFG_FILENAME
        try:
            raw = json.loads(path.read_text())
        except FileNotFoundError:
            raise ValueError(f"SAE config: {path} does not exist") from None
        except (OSError, ValueError) as exc:
            raise ValueError(f"SAE config: cannot read {path}: {exc}") from None
        return cls.from_dict(raw)


def _require(raw: Mapping[str, Any], name: str) -> Any:
    if name not in raw:
        raise ValueError(f"SAE config: {name} is missing")
    return raw[name]


def _first(raw: Mapping[str, Any], metadata: Mapping[str, Any], *names: str, default: Any = None) -> Any:
    """The first of `names` present at the top level, then under metadata."""
    for source in (raw, metadata):
        for name in names:
            if source.get(name) is not None:
                return source[name]
    return default


def _read_architecture(raw: Mapping[str, Any], metadata: Mapping[str, Any]) -> str:
    architecture = _first(raw, metadata, "architecture", default="standard")
    activation = raw.get("activation_fn") or raw.get("activation_fn_str")
    # Before SAELens 6 a top-k SAE could be "standard" with a topk activation function.
    if architecture == "standard" and activation == "topk":
        return "topk"
    return str(architecture)


def _read_normalization(value: Any) -> str:
    if value is None or value is False:
        return "none"
    if value is True:  # pre-6 boolean meant the expected-average scaling
        return "expected_average_only_in"
    return str(value)


def _read_k(raw: Mapping[str, Any]) -> Any:
    k = raw.get("k")
    kwargs = raw.get("activation_fn_kwargs")
    if k is None and isinstance(kwargs, Mapping):
        k = kwargs.get("k")
    # SAELens accepts a float k for batch-top-k configs; a whole float is still a count.
    if isinstance(k, float) and math.isfinite(k) and k.is_integer():
        return int(k)
    return k
