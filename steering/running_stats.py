"""Running statistics of chosen SAE features over all traffic, for the worker-wide monitor.

Updates are tensor ops on the activations' device (no host sync per step); a snapshot reads them back.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import torch


class RunningFeatureStats:
    """Per chosen feature: tokens seen, mean activation, how often it fired (> 0), the largest activation."""

    def __init__(self, sae_id: str, features: Sequence[int], device: torch.device | str = "cpu") -> None:
        if not features or len(set(features)) != len(features):
            raise ValueError("the worker-wide monitor needs a non-empty list of distinct feature indices")
        self.sae_id = sae_id
        self.features = torch.tensor(list(features), dtype=torch.long, device=device)  # [F]
        # float64: sums over millions of tokens would drift in float32.
        self._sum = torch.zeros(len(features), dtype=torch.float64, device=device)  # [F]
        self._num_active = torch.zeros(len(features), dtype=torch.long, device=device)  # [F]
        self._max = torch.full((len(features),), float("-inf"), dtype=torch.float64, device=device)  # [F]
        self._count = 0
        self._lock = threading.Lock()

    def update(self, acts: torch.Tensor) -> None:
        """acts [P, F]: the chosen features' activations at P tokens, columns in `features` order."""
        if acts.dim() != 2 or acts.shape[1] != self.features.numel():
            raise ValueError(f"expected activations [P, {self.features.numel()}], got {tuple(acts.shape)}")
        if acts.shape[0] == 0:
            return
        acts = acts.to(torch.float64)
        with self._lock:
            self._sum += acts.sum(dim=0)
            self._num_active += (acts > 0).sum(dim=0)
            torch.maximum(self._max, acts.amax(dim=0), out=self._max)
            self._count += acts.shape[0]

    def snapshot(self) -> dict[str, object]:
        """JSON-ready: {"sae_id", "count", "features": [{"index", "mean", "max", "frequency"}]}."""
        with self._lock:
            count = self._count
            sums, num_active, maxima = self._sum.tolist(), self._num_active.tolist(), self._max.tolist()
        features = [
            {
                "index": index,
                "mean": total / count if count else 0.0,
                "max": maximum if count else 0.0,
                "frequency": active / count if count else 0.0,
            }
            for index, total, active, maximum in zip(self.features.tolist(), sums, num_active, maxima, strict=True)
        ]
        return {"sae_id": self.sae_id, "count": count, "features": features}

    def reset(self) -> None:
        with self._lock:
            self._sum.zero_()
            self._num_active.zero_()
            self._max.fill_(float("-inf"))
            self._count = 0
