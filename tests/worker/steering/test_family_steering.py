"""Through the running engine, for each family it serves: an SAE at each hook point steers greedy decoding as HF
`generate` with a reference hook adding the same delta on HF's own module does, and a monitor there reads the
features HF's activations give, over chunked prefill, in float32."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from transformers import PreTrainedModel

from steering.hook_points import HookPoint, point_width
from steering.model_layout import ModelLayout
from steering.sae import SAE
from steering.sae_math import encode, steering_direction
from tasks.config import Config
from tasks.messages.steering import MonitorSpec, SteeringFeature, SteeringSpec
from tests.steering.reference_hooks import READ_SITES, reference_hook, reference_module
from tests.steering.sae_folders import random_tensors, sae_lens_6_cfg, write_sae_folder
from tests.worker.engine_harness import Collector, greedy, hf_greedy, load_runner, run, serve
from tests.worker.family_configs import write_family_model
from worker.engine.continuous_engine import ContinuousEngine
from worker.engine.model_runner import ModelRunner

SERVED_FAMILIES = ("llama", "mixtral", "qwen3_moe", "qwen2", "qwen3", "gemma", "phi3", "olmo2", "granite", "gpt2")
SERVED_FAMILIES += ("gpt_neox", "opt")  # the families a default context serves (no window, soft-cap or sink)
LAYER = 1
D_SAE = 16
STRENGTH = 0.5
PROMPT = list(range(200, 230))  # two prefill chunks of 16
MAX_TOKENS = 6
TOP_K = 3


@pytest.fixture(scope="module", params=SERVED_FAMILIES)
def family(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(scope="module")
def served(
    family: str, tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Config, ModelRunner, PreTrainedModel]:
    """The family's model served with an SAE at every site of layer LAYER (`<family>/<site>`), as wide as the
    model is there; and the same weights in HF."""
    root = tmp_path_factory.mktemp(family)
    folder, reference = write_family_model(family, root / "model", tiny_model_dir)
    layout = ModelLayout.of(reference)
    for site in READ_SITES:
        point = HookPoint(LAYER, site)
        width = point_width(layout, point)
        cfg = sae_lens_6_cfg(width, D_SAE, point.hook_name)
        write_sae_folder(root / "saes" / family / site, cfg, random_tensors(width, D_SAE, seed=width))
    config = Config(
        model=str(folder),
        device="cpu",
        max_num_seqs=4,
        kv_cache_tokens=1024,
        prefill_chunk_size=16,
        sae_root=str(root / "saes"),
    )
    return config, load_runner(config, stops_at_eos=False), reference


@pytest.fixture
def engine(
    served: tuple[Config, ModelRunner, PreTrainedModel], caplog: pytest.LogCaptureFixture
) -> Iterator[ContinuousEngine]:
    config, runner, _ = served
    yield from serve(runner, config, caplog)


def attached(served: tuple[Config, ModelRunner, PreTrainedModel], family: str, site: str) -> SAE:
    return served[1].saes.attach(f"{family}/{site}").sae


@pytest.mark.parametrize("site", READ_SITES)
def test_steering_at_each_site_decodes_as_hf_with_a_reference_hook(
    family: str, site: str, served: tuple[Config, ModelRunner, PreTrainedModel], engine: ContinuousEngine
) -> None:
    reference = served[2]
    delta = steering_direction(attached(served, family, site), [(0, STRENGTH)])  # [width]
    spec = SteeringSpec(f"{family}/{site}", (SteeringFeature(0, STRENGTH),))
    steered = run(engine, "steered", PROMPT, greedy(MAX_TOKENS), spec)
    handle = reference_hook(*reference_module(reference, family, LAYER, site), lambda hidden: hidden + delta)
    try:
        expected = hf_greedy(reference, frozenset(), PROMPT, MAX_TOKENS)
    finally:
        handle.remove()
    assert steered.token_ids == expected


def monitored_features(collector: Collector) -> tuple[torch.Tensor, torch.Tensor]:
    positions = [position for output in collector.outputs for position in output.monitor]
    values = torch.tensor([[value for _, value in position.features] for position in positions])
    indices = torch.tensor([[index for index, _ in position.features] for position in positions])
    return values, indices  # [P, TOP_K] each


@pytest.mark.parametrize("site", READ_SITES)
def test_a_monitor_at_each_site_reads_what_hf_computes_there(
    family: str, site: str, served: tuple[Config, ModelRunner, PreTrainedModel], engine: ContinuousEngine
) -> None:
    reference = served[2]
    watched = run(engine, "watched", PROMPT, greedy(MAX_TOKENS), monitor=MonitorSpec(f"{family}/{site}", TOP_K))
    sequence = PROMPT + watched.token_ids[:-1]  # the last generated token is never read
    seen: list[torch.Tensor] = []
    handle = reference_hook(
        *reference_module(reference, family, LAYER, site), lambda hidden: seen.append(hidden) or hidden
    )
    with torch.inference_mode():
        reference(input_ids=torch.tensor([sequence]))
    handle.remove()
    acts = encode(attached(served, family, site), seen[0].reshape(len(sequence), -1))  # [T, d_sae]
    expected_values, expected_indices = acts.topk(TOP_K, dim=-1)
    values, indices = monitored_features(watched)
    torch.testing.assert_close(values, expected_values, atol=1e-4, rtol=1e-4)
    is_active = expected_values > 1e-3  # zeros tie, in any order
    assert torch.equal(indices[is_active], expected_indices[is_active])
