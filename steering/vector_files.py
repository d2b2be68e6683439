"""Raw steering vectors (repeng-style control vectors) read from safetensors files under one root.

A file holds either one tensor [hidden], used for whatever layer the request names, or one tensor per layer keyed
by the layer's number ("0", "1", ...), as `save_file({str(k): v for k, v in control_vector.directions.items()})`
writes a repeng ControlVector. A path never reaches outside the root.
"""

from __future__ import annotations

import logging
from pathlib import Path, PurePosixPath

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

logger = logging.getLogger(__name__)
VECTOR_SUFFIX = ".safetensors"


def resolve_vector_path(root: Path, path: str) -> Path:
    """The file `path` names inside `root`; raises ValueError for escapes, other suffixes and missing files."""
    relative = PurePosixPath(path)
    if not path or "\\" in path or "\0" in path or relative.is_absolute() or ".." in relative.parts:
        raise ValueError(f"steering vector path {path!r} must be a relative path inside the vector root")
    if relative.suffix != VECTOR_SUFFIX:
        raise ValueError(f"steering vector path {path!r} must name a {VECTOR_SUFFIX} file")
    root = root.resolve()
    file = root.joinpath(*relative.parts).resolve()
    if not file.is_relative_to(root) or not file.is_file():
        raise ValueError(f"steering vector file {path!r} does not exist")
    return file


def load_vector(root: Path, path: str, layer: int, hidden_size: int) -> torch.Tensor:
    """The vector [hidden_size] for `layer` from the file `path` names, as float32 on the CPU."""
    file = resolve_vector_path(root, path)
    try:
        tensors = load_file(file, device="cpu")
    except (OSError, SafetensorError) as exc:
        # the reason names the file's absolute path: the log keeps it, the client's message only names its own path
        logger.warning("steering vector file %s cannot be read: %s", file, exc)
        raise ValueError(f"steering vector file {path!r} cannot be read") from None
    if len(tensors) == 1:
        (vector,) = tensors.values()
    elif str(layer) in tensors:
        vector = tensors[str(layer)]
    else:
        raise ValueError(f"steering vector file {path!r} has no tensor for layer {layer}")
    if tuple(vector.shape) != (hidden_size,):
        raise ValueError(f"steering vector {path!r} has shape {tuple(vector.shape)}, the model needs ({hidden_size},)")
    return vector.float()
