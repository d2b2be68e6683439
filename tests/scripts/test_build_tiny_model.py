"""scripts/build_tiny_model.py: the folder it writes loads as a Llama chat model, and reruns are no-ops."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast

from scripts.build_tiny_model import compute_build_hash, parse_args

REPO_ROOT = Path(__file__).resolve().parents[2]
MESSAGES = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "what is 3 plus 4?"},
]


def run_build(out: Path, *extra: str, as_file: bool = False) -> subprocess.CompletedProcess[str]:
    """Runs the script the Makefile's way (python -m, from the repo root) or as a file from elsewhere."""
    entry = [str(REPO_ROOT / "scripts" / "build_tiny_model.py")] if as_file else ["-m", "scripts.build_tiny_model"]
    command = [sys.executable, *entry, "--out", str(out), "--train-steps", "0", *extra]
    cwd = out.parent if as_file else REPO_ROOT
    result = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=cwd)
    assert result.returncode == 0, result.stderr
    return result


def read_stamp(out: Path) -> dict:
    return json.loads((out / "build_stamp.json").read_text())


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("models") / "tiny"
    run_build(out)
    return out


@pytest.fixture(scope="module")
def tokenizer(model_dir: Path) -> PreTrainedTokenizerFast:
    return PreTrainedTokenizerFast.from_pretrained(model_dir)


def test_model_loads_as_small_llama(model_dir: Path, tokenizer: PreTrainedTokenizerFast) -> None:
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    config = model.config
    assert config.model_type == "llama"
    assert config.max_position_embeddings >= 2048
    assert (config.num_attention_heads, config.num_key_value_heads) == (4, 2)
    assert config.vocab_size == len(tokenizer)
    assert not config.tie_word_embeddings
    eot_id, end_of_text_id = tokenizer.convert_tokens_to_ids(["<|eot_id|>", "<|end_of_text|>"])
    assert model.generation_config.eos_token_id == [eot_id, end_of_text_id]
    assert model.generation_config.pad_token_id == tokenizer.pad_token_id


def test_tokenizer_loads_with_llama3_special_tokens(model_dir: Path, tokenizer: PreTrainedTokenizerFast) -> None:
    special = (tokenizer.bos_token, tokenizer.eos_token, tokenizer.pad_token)
    assert special == ("<|begin_of_text|>", "<|eot_id|>", "<|pad|>")
    assert 1900 <= len(tokenizer) <= 2100
    auto = AutoTokenizer.from_pretrained(model_dir)
    assert auto.encode("name a color") == tokenizer.encode("name a color")


def test_chat_template_renders_and_tokenizes_with_one_bos(tokenizer: PreTrainedTokenizerFast) -> None:
    prompt = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False)
    assert prompt.startswith("<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nYou are a helpful")
    assert "<|start_header_id|>user<|end_header_id|>\n\nwhat is 3 plus 4?<|eot_id|>" in prompt
    assert prompt.endswith("<|start_header_id|>assistant<|end_header_id|>\n\n")
    ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    assert ids[0] == tokenizer.bos_token_id
    assert ids.count(tokenizer.bos_token_id) == 1
    without_prompt = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=False, tokenize=False)
    assert without_prompt.endswith("what is 3 plus 4?<|eot_id|>")


@pytest.mark.parametrize("text", ["Hello, world!  two  spaces", " line one\n\n\tline two ", "café 3+4=7 🙂"])
def test_encode_decode_round_trips_exactly(tokenizer: PreTrainedTokenizerFast, text: str) -> None:
    ids = tokenizer.encode(text)
    assert ids[0] == tokenizer.bos_token_id
    assert tokenizer.decode(ids, skip_special_tokens=True) == text


def test_greedy_generate_runs(model_dir: Path, tokenizer: PreTrainedTokenizerFast) -> None:
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    prompt = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False)
    input_ids = tokenizer(prompt, add_special_tokens=False, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        output = model.generate(input_ids, max_new_tokens=5, min_new_tokens=5, do_sample=False)
    assert output.shape == (1, input_ids.shape[1] + 5)
    assert torch.equal(output[0, : input_ids.shape[1]], input_ids[0])


def test_rerun_is_a_quick_no_op_and_force_rebuilds_identically(model_dir: Path) -> None:
    stamp = read_stamp(model_dir)
    weights = (model_dir / "model.safetensors").read_bytes()
    tokenizer_json = (model_dir / "tokenizer.json").read_text()
    started = time.monotonic()
    rerun = run_build(model_dir, as_file=True)
    assert time.monotonic() - started < 15.0  # a build trains for a minute; a no-op never imports torch
    assert "up to date" in rerun.stderr
    assert read_stamp(model_dir) == stamp

    run_build(model_dir, "--force")
    rebuilt = read_stamp(model_dir)
    assert rebuilt["built_at"] != stamp["built_at"]
    assert rebuilt["build_hash"] == stamp["build_hash"]
    assert (model_dir / "model.safetensors").read_bytes() == weights
    assert (model_dir / "tokenizer.json").read_text() == tokenizer_json
    assert not [p.name for p in model_dir.parent.iterdir() if ".building-" in p.name or ".old-" in p.name]


def test_concurrent_builds_wait_for_each_other(tmp_path: Path) -> None:
    out = tmp_path / "tiny"
    command = [sys.executable, "-m", "scripts.build_tiny_model", "--out", str(out), "--train-steps", "0"]
    builders = [subprocess.Popen(command, cwd=REPO_ROOT, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    logs = [builder.communicate(timeout=120)[1] for builder in builders]
    assert [builder.returncode for builder in builders] == [0, 0]
    assert sum(f"built {out} in" in log for log in logs) == 1
    assert sum("up to date" in log for log in logs) == 1


def test_build_hash_depends_on_arguments(model_dir: Path) -> None:
    def build_hash(*extra: str) -> str:
        return compute_build_hash(parse_args(["--out", "x", "--train-steps", "0", *extra]))

    assert build_hash() == build_hash("--out", "elsewhere", "--force")
    assert build_hash() != build_hash("--seed", "1")
    assert build_hash() != build_hash("--train-steps", "400")
    assert build_hash() != build_hash("--num-layers", "1")
    assert build_hash() != build_hash("--tokenizer-from", str(model_dir))


def test_a_draft_model_shares_the_tokenizer_and_has_its_own_depth(model_dir: Path) -> None:
    draft_dir = model_dir.parent / "draft"
    run_build(draft_dir, "--num-layers", "1", "--tokenizer-from", str(model_dir))
    draft = AutoModelForCausalLM.from_pretrained(draft_dir)
    assert draft.config.num_hidden_layers == 1
    assert (draft_dir / "tokenizer.json").read_bytes() == (model_dir / "tokenizer.json").read_bytes()
