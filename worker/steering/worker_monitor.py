"""The worker-wide monitor: running statistics of chosen SAE features over every token the engine computes."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from steering.hook_points import HookPoint
from steering.running_stats import RunningFeatureStats
from steering.step_plan import StatsTap
from worker.steering.sae_attachments import SAEAttachments


@dataclass(frozen=True)
class WorkerMonitor:
    point: HookPoint
    tap: StatsTap

    @property
    def stats(self) -> RunningFeatureStats:
        return self.tap.stats


def start_worker_monitor(attachments: SAEAttachments, sae_id: str, features: Sequence[int]) -> WorkerMonitor:
    """Raises SAELookupError or ValueError for an unknown SAE or feature indices outside [0, d_sae)."""
    attached = attachments.attach(sae_id)
    d_sae = attached.sae.config.d_sae
    if any(isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < d_sae for index in features):
        raise ValueError(f"monitored feature indices must lie in [0, {d_sae})")
    stats = RunningFeatureStats(sae_id, features, attachments.device)
    return WorkerMonitor(attached.point, StatsTap(attached.sae, stats))
