"""/health/ready's body: per served model, its live workers with their heartbeat age and load, and its queues."""

from __future__ import annotations

from typing import Any

from api.observability.cluster import ClusterState, ModelState
from tasks.messages.generation import ErrorInfo


def readiness(state: ClusterState) -> tuple[dict[str, Any], bool]:
    """The body, and whether every served model has a live worker."""
    models = {model.name: _model(model, state.read_at) for model in state.models}
    not_ready = [model.name for model in state.models if not model.workers]
    body: dict[str, Any] = {"status": "unavailable" if not_ready else "ready", "models": models}
    if not_ready:
        message = f"No live worker serves {', '.join(not_ready)}; retry shortly."
        body["error"] = ErrorInfo(message, "service_unavailable", None, "no_worker_available").to_dict()
    return body, not not_ready


def _model(model: ModelState, now: float) -> dict[str, Any]:
    return {
        "status": "ready" if model.workers else "unavailable",
        "workers": [
            {
                "name": worker.worker,
                "quantization": worker.quantization,
                "kv_cache_dtype": worker.kv_cache_dtype,
                "kv_cache_tokens": worker.kv_cache_tokens,
                "heartbeat_age_s": round(worker.heartbeat_age_s(now), 3),
                "num_requests_running": worker.num_running,
                "num_requests_waiting": worker.num_waiting,
                "kv_cache_usage": round(worker.kv_cache_usage, 4),
            }
            for worker in model.workers
        ],
        "queue_depth": model.queue_depth,
        "num_requests_running": model.num_running,
        "num_requests_waiting": model.num_waiting,
        "kv_cache_usage": round(model.kv_cache_usage, 4),
    }
