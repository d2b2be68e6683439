"""Host <-> device copies that do not stall the step.

On CUDA, `torch.tensor(values, device="cuda")` and `tensor.tolist()` each wait for every kernel queued before them:
a sampler that builds its parameters that way waits for the forward pass several times over, and reads its results
back row by row. Here values go to the device asynchronously (pageable memory is staged by the driver as the copy is
queued, so the host list may go at once), and results come back together, with one wait for the device.

A step waits once, for its tokens and logprobs (worker/engine/sampling/step_readback.py). What still waits, by design or
left: a step in which a monitor reads waits a second time, for the monitors' top-k (worker/steering/steering_plan.py);
speculative verify rows read their argmax or acceptance draws back row by row (worker/engine/speculation/), and a draft
model's proposal steps read their tokens back each (those steps are eager, and only batches of at most
SPEC_MAX_BATCH_SIZE rows speculate); a decode graph is captured again, with one device synchronization, when a step
steers or monitors at a hook point the graphs do not cover yet.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def to_device(values: Sequence[int] | Sequence[float], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """[len(values)] of `dtype` on `device`, queued without waiting for the device."""
    tensor = torch.tensor(values, dtype=dtype)
    return tensor if device.type == "cpu" else tensor.to(device, non_blocking=True)


def to_host(*tensors: torch.Tensor) -> list[torch.Tensor]:
    """CPU copies of `tensors`, after one wait for the device however many there are: a step's one transfer."""
    devices = {tensor.device for tensor in tensors if tensor.device.type != "cpu"}
    if not devices:
        return list(tensors)
    copies = [tensor.to("cpu", non_blocking=True) for tensor in tensors]  # into pinned memory, queued in order
    for device in devices:
        torch.cuda.current_stream(device).synchronize()
    return copies
