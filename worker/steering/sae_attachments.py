"""What the model can be steered and monitored with: the SAEs under the configured root that fit it, and raw
steering vectors, each checked against the model and cast to its device and dtype once."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import torch

from steering.hook_points import RESID_POST, HookPoint, check_sae_fits
from steering.model_layout import ModelLayout
from steering.registry import SAEListing, SAERegistry
from steering.sae import SAE
from steering.sae_config import SAEConfig
from steering.vector_files import load_vector
from tasks.config import Config
from tasks.messages.steering import SteeringVector
from worker.kernels.openmp_pool import release_thread_pool

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class AttachedSAE:
    sae: SAE  # on the model's device and dtype
    point: HookPoint


class SAEAttachments:
    """Thread-safe: Celery threads resolve their requests' steering here while the engine thread runs."""

    def __init__(self, layout: ModelLayout, config: Config, device: torch.device, dtype: torch.dtype) -> None:
        self._layout = layout
        self.registry = SAERegistry(Path(config.sae_root), device, dtype)
        self._vector_root = Path(config.steering_vector_root)
        self.num_layers = layout.num_layers
        self.hidden_size = layout.hidden_size
        self.device = device
        self.dtype = dtype

    def attach(self, sae_id: str) -> AttachedSAE:
        """The SAE and where it hooks; raises SAELookupError or ValueError (files, or a mismatch with the model)."""
        config = SAEConfig.read(self.registry.resolve(sae_id))
        point = check_sae_fits(self._layout, config)
        sae = self.registry.get(sae_id)
        # Loading it may have run torch's parallel operators on this thread (a request's, the steering sync's):
        # leave the engine thread's OpenMP team the only one (worker/kernels/openmp_pool.py)
        release_thread_pool()
        return AttachedSAE(sae, point)

    def listings(self) -> list[SAEListing]:
        """The SAEs under the root that fit this model (read from their configs; no weights are loaded)."""
        fitting = []
        for listing in self.registry.listings():
            try:
                check_sae_fits(self._layout, SAEConfig.read(self.registry.resolve(listing.id)))
            except ValueError as exc:
                logger.info("SAE %s does not fit the model: %s", listing.id, exc)
                continue
            fitting.append(listing)
        return fitting

    def vector_point(self, vector: SteeringVector) -> HookPoint:
        if not 0 <= vector.layer < self.num_layers:
            raise ValueError(f"steering vector layer {vector.layer} is outside [0, {self.num_layers})")
        return HookPoint(vector.layer, RESID_POST)  # repeng adds its control vectors to decoder layer outputs

    def vector(self, vector: SteeringVector) -> torch.Tensor:
        """The vector's direction [hidden] (before its strength), float32 on the model's device."""
        if (vector.values is None) == (vector.path is None):
            raise ValueError("a steering vector needs exactly one of values and path")
        if vector.path is not None:
            values = load_vector(self._vector_root, vector.path, vector.layer, self.hidden_size)
        else:
            if len(vector.values) != self.hidden_size:
                raise ValueError(f"steering vector has {len(vector.values)} values; the model needs {self.hidden_size}")
            values = torch.tensor(vector.values, dtype=torch.float32)
        if not bool(values.isfinite().all()):
            raise ValueError(f"steering vector for layer {vector.layer} holds values that are not finite")
        return values.to(self.device)
