"""Pooling as the model directory declares it (sentence-transformers' `modules.json` and its Pooling config), else
the last token; modes we do not compute are refused, naming what the config sets."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from worker.engine.embedding.packed_attention import window_mask
from worker.engine.embedding.pooling import POOLING_MODULE, Pooling, pool, read_pooling


def write_pooling(model_dir: Path, **modes: bool) -> None:
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": POOLING_MODULE},
    ]
    (model_dir / "modules.json").write_text(json.dumps(modules))
    (model_dir / "1_Pooling").mkdir()
    settings = {"word_embedding_dimension": 128, **{f"pooling_mode_{mode}": on for mode, on in modes.items()}}
    (model_dir / "1_Pooling" / "config.json").write_text(json.dumps(settings))


def test_a_model_without_a_pooling_config_pools_its_last_token(tmp_path: Path) -> None:
    assert read_pooling(str(tmp_path)) is Pooling.LAST


@pytest.mark.parametrize(
    ("modes", "expected"),
    [
        ({"mean_tokens": True, "cls_token": False}, Pooling.MEAN),
        ({"lasttoken": True}, Pooling.LAST),
        ({"cls_token": True, "max_tokens": False}, Pooling.FIRST),
    ],
)
def test_the_sentence_transformers_pooling_config_decides(tmp_path: Path, modes: dict, expected: Pooling) -> None:
    write_pooling(tmp_path, **modes)
    assert read_pooling(str(tmp_path)) is expected


@pytest.mark.parametrize("modes", [{"max_tokens": True}, {"mean_tokens": True, "max_tokens": True}, {}])
def test_modes_we_do_not_compute_are_refused_by_name(tmp_path: Path, modes: dict) -> None:
    write_pooling(tmp_path, **modes)
    with pytest.raises(ValueError, match="pooling"):
        read_pooling(str(tmp_path))


def test_pool_takes_each_inputs_first_mean_or_last_row() -> None:
    hidden = torch.arange(12.0).view(6, 2)  # inputs of 1, 3 and 2 tokens
    lengths = [1, 3, 2]
    assert pool(hidden, lengths, Pooling.FIRST).tolist() == [[0, 1], [2, 3], [8, 9]]
    assert pool(hidden, lengths, Pooling.LAST).tolist() == [[0, 1], [6, 7], [10, 11]]
    assert pool(hidden, lengths, Pooling.MEAN).tolist() == [[0, 1], [4, 5], [9, 10]]


def test_window_mask_lets_a_query_see_itself_and_the_window_before_it() -> None:
    mask = window_mask(5, 2, torch.device("cpu"))
    assert mask.int().tolist() == [[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [0, 1, 1, 0, 0], [0, 0, 1, 1, 0], [0, 0, 0, 1, 1]]
    assert window_mask(5, 5, torch.device("cpu")) is None and window_mask(5, None, torch.device("cpu")) is None
