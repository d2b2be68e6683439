"""Steering vector files: one tensor for any layer, or one per layer (repeng), never outside the root."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from steering.vector_files import load_vector


@pytest.fixture
def root(tmp_path: Path) -> Path:
    save_file({"direction": torch.arange(4.0)}, tmp_path / "one.safetensors")
    save_file({"1": torch.ones(4), "3": torch.full((4,), 3.0)}, tmp_path / "layers.safetensors")
    (tmp_path / "root").mkdir()
    (tmp_path / "root" / "sub").mkdir()
    for name in ("one", "layers"):
        (tmp_path / "root" / "sub" / f"{name}.safetensors").write_bytes((tmp_path / f"{name}.safetensors").read_bytes())
    (tmp_path / "root" / "link.safetensors").symlink_to(tmp_path / "one.safetensors")
    return tmp_path / "root"


def test_a_single_tensor_serves_any_layer_and_a_repeng_file_its_own(root: Path) -> None:
    assert torch.equal(load_vector(root, "sub/one.safetensors", 7, 4), torch.arange(4.0))
    assert torch.equal(load_vector(root, "sub/layers.safetensors", 3, 4), torch.full((4,), 3.0))
    with pytest.raises(ValueError, match="no tensor for layer 2"):
        load_vector(root, "sub/layers.safetensors", 2, 4)
    with pytest.raises(ValueError, match=r"needs \(5,\)"):
        load_vector(root, "sub/one.safetensors", 0, 5)


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("../one.safetensors", "inside the vector root"),
        ("/etc/passwd.safetensors", "inside the vector root"),
        ("sub/one.pt", "must name a .safetensors file"),
        ("link.safetensors", "does not exist"),
        ("sub/missing.safetensors", "does not exist"),
    ],
)
def test_paths_stay_inside_the_root(root: Path, path: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        load_vector(root, path, 0, 4)
