"""The bad-input rule at every hook point: an SAE whose site, layer or width does not fit the model is not listed
(so a request naming it is a 400 at the api, which checks ids against the listings) and is refused when attached."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from steering.model_layout import ModelLayout
from tasks.config import Config
from tests.steering.sae_folders import random_tensors, sae_lens_6_cfg, write_sae_folder
from tests.worker.family_configs import build_family_model
from worker.steering.sae_attachments import SAEAttachments

HIDDEN = 64  # the family configs' hidden size; gpt_neox's 4 heads of 16 make attn.hook_z as wide


@pytest.fixture
def attachments(tmp_path: Path) -> SAEAttachments:
    saes = {
        "fits/z": ("blocks.1.attn.hook_z", HIDDEN),
        "fits/mlp_out": ("blocks.3.hook_mlp_out", HIDDEN),
        "wrong_width/z": ("blocks.1.attn.hook_z", HIDDEN + 1),
        "no_such_site/mid": ("blocks.1.hook_resid_mid", HIDDEN),  # a parallel-residual layer has no resid_mid
        "no_such_layer/attn_out": ("blocks.4.hook_attn_out", HIDDEN),
        "unknown_site/q": ("blocks.1.attn.hook_q", HIDDEN),
    }
    for sae_id, (hook_name, width) in saes.items():
        write_sae_folder(tmp_path / sae_id, sae_lens_6_cfg(width, 8, hook_name), random_tensors(width, 8))
    layout = ModelLayout.of(build_family_model("gpt_neox"))
    return SAEAttachments(layout, Config(sae_root=str(tmp_path)), torch.device("cpu"), torch.float32)


def test_only_saes_that_fit_are_listed(attachments: SAEAttachments) -> None:
    assert [listing.id for listing in attachments.listings()] == ["fits/mlp_out", "fits/z"]


@pytest.mark.parametrize(
    ("sae_id", "reason"),
    [
        ("wrong_width/z", "SAE d_in 65 does not match the model's width 64 at attn.hook_z"),
        ("no_such_site/mid", "this model's layers have no hook_resid_mid"),
        ("no_such_layer/attn_out", "names layer 4; the model has 4 layers"),
        ("unknown_site/q", "is not supported: SAEs attach at"),
    ],
)
def test_saes_that_do_not_fit_are_refused_when_attached(attachments: SAEAttachments, sae_id: str, reason: str) -> None:
    with pytest.raises(ValueError) as refused:
        attachments.attach(sae_id)
    assert reason in str(refused.value)
