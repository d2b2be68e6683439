"""What the api reads of a served model's config.json (it never imports torch, so no transformers config class): the
context length, layer count and hidden size, under their usual names and GPT-2's (n_positions, n_layer, n_embd)."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest

from api.models.model_info import load_model_info
from tasks.config import Config

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


def model_folder(tmp_path: Path, tiny_model_dir: Path, config_json: dict) -> Path:
    folder = tmp_path / "model"
    folder.mkdir()
    for name in TOKENIZER_FILES:
        shutil.copy(tiny_model_dir / name, folder / name)
    (folder / "config.json").write_text(json.dumps(config_json))
    return folder


@pytest.mark.parametrize(
    "config_json",
    [
        {"model_type": "gpt2", "n_positions": 512, "n_layer": 3, "n_embd": 96},
        {"model_type": "llama", "max_position_embeddings": 512, "num_hidden_layers": 3, "hidden_size": 96},
        {
            "model_type": "gemma3",
            "text_config": {"max_position_embeddings": 512, "num_hidden_layers": 3, "hidden_size": 96},
        },
    ],
)
def test_sizes_are_read_under_either_name(tmp_path: Path, tiny_model_dir: Path, config_json: dict) -> None:
    config = Config(model=str(model_folder(tmp_path, tiny_model_dir, config_json)))
    info = load_model_info(config)
    assert (info.max_model_len, info.num_layers, info.hidden_size) == (512, 3, 96)


def test_a_config_without_a_context_length_asks_for_max_model_len(tmp_path: Path, tiny_model_dir: Path) -> None:
    config = Config(model=str(model_folder(tmp_path, tiny_model_dir, {"model_type": "x", "n_layer": 2})))
    with pytest.raises(ValueError, match="MAX_MODEL_LEN"):
        load_model_info(config)
    assert load_model_info(dataclasses.replace(config, max_model_len=64)).max_model_len == 64
