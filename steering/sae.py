"""An SAE: its config plus the tensors SAELens saves, loaded from safetensors only (never unpickled)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from steering.sae_config import WEIGHTS_FILENAME, SAEConfig


@dataclass(frozen=True, eq=False)
class SAE:
    config: SAEConfig
    W_enc: torch.Tensor  # [d_in, d_sae]
    W_dec: torch.Tensor  # [d_sae, d_in]
    b_enc: torch.Tensor  # [d_sae]
    b_dec: torch.Tensor  # [d_in]
    threshold: torch.Tensor | None = None  # [d_sae], jumprelu only

    def __post_init__(self) -> None:
        d_in, d_sae = self.config.d_in, self.config.d_sae
        expected = {"W_enc": (d_in, d_sae), "W_dec": (d_sae, d_in), "b_enc": (d_sae,), "b_dec": (d_in,)}
        if self.config.architecture == "jumprelu":
            expected["threshold"] = (d_sae,)
        for name, shape in expected.items():
            tensor = getattr(self, name)
            if tensor is None:
                raise ValueError(f"SAE weights: {name} is missing (needed by a {self.config.architecture} SAE)")
            if tuple(tensor.shape) != shape:
                raise ValueError(f"SAE weights: {name} has shape {tuple(tensor.shape)}, cfg.json implies {shape}")

    @property
    def device(self) -> torch.device:
        return self.W_dec.device

    @property
    def dtype(self) -> torch.dtype:
        return self.W_dec.dtype

    def to(self, device: torch.device | str, dtype: torch.dtype) -> SAE:
        """A copy on the model's device and dtype; meant to be done once, when the SAE is attached."""
        moved = {
            name: None if tensor is None else tensor.to(device=device, dtype=dtype).contiguous()
            for name, tensor in self.tensors().items()
        }
        return dataclasses.replace(self, **moved)

    def tensors(self) -> dict[str, torch.Tensor | None]:
        return {
            "W_enc": self.W_enc,
            "W_dec": self.W_dec,
            "b_enc": self.b_enc,
            "b_dec": self.b_dec,
            "threshold": self.threshold,
        }

    @classmethod
    def load(cls, folder: Path) -> SAE:
        """Reads `cfg.json` and `sae_weights.safetensors` from one SAELens folder onto the CPU."""
        config = SAEConfig.read(folder)
        path = folder / WEIGHTS_FILENAME
        if not path.is_file():
            raise ValueError(f"SAE weights: {path} does not exist")
        try:
            weights = load_file(path, device="cpu")
        except (OSError, SafetensorError) as exc:
            raise ValueError(f"SAE weights: cannot read {path}: {exc}") from None
        # SAELens before 6 stored JumpReLU thresholds as logarithms.
        if "threshold" not in weights and "log_threshold" in weights:
            weights["threshold"] = weights["log_threshold"].exp()
        threshold = weights.get("threshold") if config.architecture == "jumprelu" else None
        return cls(
            config=config,
            W_enc=weights.get("W_enc"),
            W_dec=weights.get("W_dec"),
            b_enc=weights.get("b_enc"),
            b_dec=weights.get("b_dec"),
            threshold=threshold,
        )
