"""steering/registry.py: listing, loading once, and ids that cannot leave the root."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from steering.registry import SAEListing, SAELookupError, SAERegistry
from tests.steering.sae_folders import random_tensors, sae_lens_6_cfg, write_sae_folder


@pytest.fixture
def root(tmp_path: Path) -> Path:
    root = tmp_path / "saes"
    write_sae_folder(
        root / "tiny" / "resid_post_2", sae_lens_6_cfg(4, 8, "blocks.2.hook_resid_post"), random_tensors(4, 8)
    )
    write_sae_folder(
        root / "other", sae_lens_6_cfg(4, 16, "blocks.0.hook_resid_pre", "topk", k=2), random_tensors(4, 16)
    )
    return root


def test_listings_name_every_sae_by_its_path_under_the_root(root: Path) -> None:
    (root / "broken").mkdir()
    (root / "broken" / "cfg.json").write_text('{"d_in": 4}')
    (root / "broken" / "sae_weights.safetensors").write_bytes(b"")
    (root / "no_weights").mkdir()
    (root / "no_weights" / "cfg.json").write_text("{}")
    assert SAERegistry(root).listings() == [
        SAEListing("other", "blocks.0.hook_resid_pre", 4, 16, "topk"),
        SAEListing("tiny/resid_post_2", "blocks.2.hook_resid_post", 4, 8, "standard"),
    ]


def test_listings_of_a_missing_root_are_empty(tmp_path: Path) -> None:
    assert SAERegistry(tmp_path / "nothing").listings() == []


def test_get_casts_once_and_caches(root: Path) -> None:
    registry = SAERegistry(root, device="cpu", dtype=torch.float64)
    sae = registry.get("tiny/resid_post_2")
    assert sae.dtype == torch.float64 and sae.config.hook_name == "blocks.2.hook_resid_post"
    assert registry.get("tiny/resid_post_2") is sae


@pytest.mark.parametrize(
    "sae_id", ["", "..", "../saes/other", "tiny/../other", "/etc", "tiny//resid_post_2", "./other", "tiny\\resid", 5]
)
def test_malformed_ids_are_refused(root: Path, sae_id: object) -> None:
    with pytest.raises(SAELookupError) as raised:
        SAERegistry(root).get(sae_id)  # type: ignore[arg-type]
    assert raised.value.code == "invalid_sae_id"
    assert str(root) not in raised.value.message


@pytest.mark.parametrize("sae_id", ["missing", "tiny", "tiny/resid_post_2/cfg.json"])
def test_unknown_ids_are_not_found(root: Path, sae_id: str) -> None:
    with pytest.raises(SAELookupError) as raised:
        SAERegistry(root).get(sae_id)
    assert raised.value.code == "sae_not_found"
    assert raised.value.message == f"unknown sae_id {sae_id!r}"


def test_symlinked_folder_out_of_the_root_is_refused(root: Path, tmp_path: Path) -> None:
    outside = write_sae_folder(
        tmp_path / "outside", sae_lens_6_cfg(4, 8, "blocks.0.hook_resid_pre"), random_tensors(4, 8)
    )
    os.symlink(outside, root / "escape")
    registry = SAERegistry(root)
    with pytest.raises(SAELookupError) as raised:
        registry.get("escape")
    assert raised.value.code == "invalid_sae_id"
    assert "escape" not in [listing.id for listing in registry.listings()]


def test_symlinked_files_out_of_the_root_are_refused(root: Path, tmp_path: Path) -> None:
    outside = write_sae_folder(
        tmp_path / "outside", sae_lens_6_cfg(4, 8, "blocks.0.hook_resid_pre"), random_tensors(4, 8)
    )
    (root / "sneaky").mkdir()
    for name in ("cfg.json", "sae_weights.safetensors"):
        os.symlink(outside / name, root / "sneaky" / name)
    with pytest.raises(SAELookupError, match="unknown sae_id 'sneaky'"):
        SAERegistry(root).get("sneaky")


def test_symlink_within_the_root_is_followed(root: Path) -> None:
    os.symlink(root / "tiny" / "resid_post_2", root / "alias")
    registry = SAERegistry(root)
    assert registry.get("alias") is registry.get("tiny/resid_post_2")
