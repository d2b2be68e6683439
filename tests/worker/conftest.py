from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from tasks.config import Config
from tests.worker.engine_harness import SHORT_MAX_MODEL_LEN, load_runner, serve
from worker.engine.continuous_engine import ContinuousEngine
from worker.engine.model_runner import ModelRunner


@pytest.fixture(scope="session")
def tiny_config(tiny_model_dir: Path) -> Config:
    sae_root = str(tiny_model_dir.parent / "saes")  # where tiny_sae_root builds its SAE
    return Config(model=str(tiny_model_dir), device="cpu", max_num_seqs=32, kv_cache_tokens=16384, sae_root=sae_root)


@pytest.fixture(scope="module")
def runner(tiny_config: Config) -> ModelRunner:
    return load_runner(tiny_config)


@pytest.fixture(scope="module")
def endless_runner(tiny_config: Config) -> ModelRunner:
    return load_runner(tiny_config, stops_at_eos=False)


@pytest.fixture(scope="module")
def gather_endless_runner(tiny_config: Config) -> ModelRunner:
    """Decode attention by gathering blocks: the path without the CPU decode kernel."""
    return load_runner(dataclasses.replace(tiny_config, attention_backend="sdpa"), stops_at_eos=False)


@pytest.fixture(scope="module")
def compiled_endless_runner(tiny_config: Config) -> ModelRunner:
    """The forward under torch.compile (compiled at load by its warm-up)."""
    return load_runner(dataclasses.replace(tiny_config, torch_compile=True), stops_at_eos=False)


@pytest.fixture(scope="module")
def short_runner(tiny_config: Config) -> ModelRunner:
    return load_runner(dataclasses.replace(tiny_config, max_model_len=SHORT_MAX_MODEL_LEN), stops_at_eos=False)


@pytest.fixture
def engine(runner: ModelRunner, tiny_config: Config, caplog: pytest.LogCaptureFixture) -> Iterator[ContinuousEngine]:
    yield from serve(runner, tiny_config, caplog)


def engine_on(runner_fixture: str) -> Callable[..., Iterator[ContinuousEngine]]:
    """A fixture serving an engine over the named runner fixture."""

    @pytest.fixture
    def serving(
        request: pytest.FixtureRequest, tiny_config: Config, caplog: pytest.LogCaptureFixture
    ) -> Iterator[ContinuousEngine]:
        yield from serve(request.getfixturevalue(runner_fixture), tiny_config, caplog)

    return serving


endless_engine = engine_on("endless_runner")
gather_endless_engine = engine_on("gather_endless_runner")
compiled_endless_engine = engine_on("compiled_endless_runner")
short_engine = engine_on("short_runner")


@pytest.fixture(scope="session")
def reference_model(tiny_model_dir: Path) -> PreTrainedModel:
    """The same weights under HF's own attention, for `generate`."""
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="session")
def tokenizer(tiny_model_dir: Path) -> PreTrainedTokenizerBase:
    return AutoTokenizer.from_pretrained(tiny_model_dir)
