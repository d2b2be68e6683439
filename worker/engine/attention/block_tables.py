"""Index tensors a step builds from its chunks' requests: token lists as int64 tensors, and padded block tables."""

from __future__ import annotations

from array import array

import torch

from scheduler.batch import ScheduledChunk


def int64_tensor(values: list[int], device: torch.device) -> torch.Tensor:
    """[len(values)] int64 on `device`. Through an array rather than torch.tensor(list): a step builds several of
    these, and torch.tensor converts a list 3x slower."""
    if not values:
        return torch.empty(0, dtype=torch.int64, device=device)
    tensor = torch.frombuffer(array("q", values), dtype=torch.int64)
    return tensor if device.type == "cpu" else tensor.to(device, non_blocking=True)


def padded_block_tables(chunks: list[ScheduledChunk]) -> torch.Tensor:
    """[R, max_blocks] int64 on the CPU, padded with block 0 (masked out wherever it pads)."""
    tables = [chunk.request.block_table for chunk in chunks]
    width = max(map(len, tables))
    flat: list[int] = []
    for table in tables:
        flat += table
        if len(table) < width:
            flat += [0] * (width - len(table))
    return int64_tensor(flat, torch.device("cpu")).view(len(chunks), width)
