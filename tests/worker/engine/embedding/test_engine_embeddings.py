"""Embeddings through the engine equal HF's own forward: the decoder's last hidden state (after its final norm),
pooled as the model's config says and L2-normalised, computed here in float32 from `AutoModel`; inputs of several
lengths and several requests share forwards; steering adds the same delta a hook on HF's layer adds; the families
whose attention slides, soft-caps or sinks embed as HF does past their window."""

from __future__ import annotations

import itertools
import queue
import random
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from transformers import AutoModel, PreTrainedModel

from tasks.config import Config
from tasks.messages.steering import SteeringFeature, SteeringSpec, SteeringVector
from tests.worker.engine.embedding.test_pooling import write_pooling
from tests.worker.engine_harness import TIMEOUT_S, load_runner, serve
from tests.worker.family_configs import write_family_model
from worker.engine.continuous_engine import ContinuousEngine
from worker.engine.embedding.jobs import EmbeddingRequest, EmbeddingResult

ATOL = 1e-5  # float32; the packed forward sums in another order than HF's padded one
RNG = random.Random(29)
INPUTS = [[RNG.randrange(5, 2000) for _ in range(length)] for length in (1, 7, 40, 23)]
NUMBERS = itertools.count()


def embed_together(engine: ContinuousEngine, requests: list[EmbeddingRequest]) -> list[EmbeddingResult]:
    """Submitted one after another; the engine thread takes whatever waits at once, so they share forwards."""
    answers: queue.Queue[EmbeddingResult] = queue.Queue()
    for request in requests:
        engine.submit_embedding(request, answers.put)
    results = {}
    for _ in requests:
        result = answers.get(timeout=TIMEOUT_S)
        results[result.request_id] = result
    return [results[request.request_id] for request in requests]


def request_of(inputs: list[list[int]], **fields: object) -> EmbeddingRequest:
    return EmbeddingRequest(f"embd-{next(NUMBERS)}", inputs, **fields)


def hf_embeddings(model: PreTrainedModel, inputs: list[list[int]], dimensions: int | None = None) -> torch.Tensor:
    """[B, D]: each input alone through HF's decoder, its last token's hidden state, truncated and normalised."""
    with torch.no_grad():
        last = [model(torch.tensor([ids])).last_hidden_state[0, -1].float() for ids in inputs]
    return F.normalize(torch.stack(last)[:, :dimensions], dim=-1)


@pytest.fixture(scope="module")
def hf_decoder(tiny_model_dir: Path) -> PreTrainedModel:
    return AutoModel.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()


def test_each_input_of_each_request_is_hf_last_hidden_state_normalised(
    engine: ContinuousEngine, hf_decoder: PreTrainedModel
) -> None:
    first, second = embed_together(engine, [request_of(INPUTS[:3]), request_of(INPUTS[3:])])
    assert first.error is None and second.error is None
    assert first.vectors.shape == (3, 128) and second.vectors.shape == (1, 128)
    torch.testing.assert_close(first.vectors, hf_embeddings(hf_decoder, INPUTS[:3]), atol=ATOL, rtol=0)
    torch.testing.assert_close(second.vectors, hf_embeddings(hf_decoder, INPUTS[3:]), atol=ATOL, rtol=0)
    assert torch.allclose(first.vectors.norm(dim=-1), torch.ones(3))


def test_dimensions_keep_the_leading_components_renormalised(
    engine: ContinuousEngine, hf_decoder: PreTrainedModel
) -> None:
    (result,) = embed_together(engine, [request_of(INPUTS, dimensions=16)])
    assert result.vectors.shape == (len(INPUTS), 16)
    torch.testing.assert_close(result.vectors, hf_embeddings(hf_decoder, INPUTS, 16), atol=ATOL, rtol=0)


def test_inputs_longer_than_a_forward_budget_are_split_over_forwards(
    tiny_config: Config, hf_decoder: PreTrainedModel, caplog: pytest.LogCaptureFixture
) -> None:
    config = Config(**{**tiny_config.__dict__, "max_num_batched_tokens": 30})
    for engine in serve(load_runner(config), config, caplog):
        (result,) = embed_together(engine, [request_of(INPUTS)])  # 40 tokens alone, then 7 + 1, then 23
        torch.testing.assert_close(result.vectors, hf_embeddings(hf_decoder, INPUTS), atol=ATOL, rtol=0)


def test_a_steered_request_gets_hf_with_the_same_delta_and_its_neighbour_none(
    engine: ContinuousEngine, hf_decoder: PreTrainedModel
) -> None:
    values = [RNG.uniform(-1, 1) for _ in range(128)]
    spec = SteeringSpec(vectors=(SteeringVector(layer=2, strength=3.0, values=tuple(values)),))
    steered, plain = embed_together(engine, [request_of(INPUTS[1:3], steering=spec), request_of(INPUTS[1:3])])
    delta = 3.0 * torch.tensor(values)
    handle = hf_decoder.layers[2].register_forward_hook(lambda module, args, output: output + delta)
    try:
        expected = hf_embeddings(hf_decoder, INPUTS[1:3])
    finally:
        handle.remove()
    torch.testing.assert_close(steered.vectors, expected, atol=ATOL, rtol=0)
    torch.testing.assert_close(plain.vectors, hf_embeddings(hf_decoder, INPUTS[1:3]), atol=ATOL, rtol=0)
    assert (steered.vectors - plain.vectors).abs().max() > 0.01


def test_a_steering_sae_the_worker_lacks_is_the_requests_error(engine: ContinuousEngine) -> None:
    (result,) = embed_together(
        engine, [request_of(INPUTS[:1], steering=SteeringSpec("no-such-sae", (SteeringFeature(0, 1.0),)))]
    )
    assert result.vectors is None and result.error_param == "steering.sae_id" and "no-such-sae" in result.error


@pytest.fixture(params=["mistral", "gemma2", "gpt_oss"])
def family_engine(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    tiny_model_dir: Path,
    caplog: pytest.LogCaptureFixture,
) -> Iterator[tuple[ContinuousEngine, Path]]:
    overrides = {"attn_logit_softcapping": 2.0} if request.param == "gemma2" else {}
    model_dir, _ = write_family_model(
        request.param, tmp_path_factory.mktemp(request.param), tiny_model_dir, **overrides
    )
    config = Config(model=str(model_dir), device="cpu", max_num_seqs=4, kv_cache_tokens=1024)
    for engine in serve(load_runner(config), config, caplog):
        yield engine, model_dir


def test_families_that_slide_softcap_or_sink_embed_as_hf(family_engine: tuple[ContinuousEngine, Path]) -> None:
    engine, model_dir = family_engine
    long_inputs = [[RNG.randrange(5, 2000) for _ in range(length)] for length in (75, 9)]  # 75: past the window
    (result,) = embed_together(engine, [request_of(long_inputs)])
    reference = AutoModel.from_pretrained(model_dir, dtype=torch.float32).eval()
    torch.testing.assert_close(result.vectors, hf_embeddings(reference, long_inputs), atol=1e-4, rtol=0)


def pooled_model_dir(tiny_model_dir: Path, target: Path, **modes: bool) -> Path:
    """The tiny model's files with a sentence-transformers pooling config beside them."""
    shutil.copytree(tiny_model_dir, target)
    write_pooling(target, **modes)
    return target


def test_a_mean_pooling_config_averages_every_tokens_hidden_state(
    tiny_model_dir: Path, tmp_path: Path, hf_decoder: PreTrainedModel, caplog: pytest.LogCaptureFixture
) -> None:
    model_dir = pooled_model_dir(tiny_model_dir, tmp_path / "mean", mean_tokens=True)
    config = Config(model=str(model_dir), device="cpu", max_num_seqs=4, kv_cache_tokens=1024)
    for engine in serve(load_runner(config), config, caplog):
        (result,) = embed_together(engine, [request_of(INPUTS)])
    with torch.no_grad():
        means = [hf_decoder(torch.tensor([ids])).last_hidden_state[0].mean(0) for ids in INPUTS]
    torch.testing.assert_close(result.vectors, F.normalize(torch.stack(means), dim=-1), atol=ATOL, rtol=0)


def test_a_pooling_config_we_do_not_compute_refuses_embeddings_naming_the_model(
    tiny_model_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    model_dir = pooled_model_dir(tiny_model_dir, tmp_path / "max", max_tokens=True)
    config = Config(model=str(model_dir), device="cpu", max_num_seqs=4, kv_cache_tokens=1024)
    for engine in serve(load_runner(config), config, caplog):
        (result,) = embed_together(engine, [request_of(INPUTS)])
    assert result.vectors is None and result.error_param == "model" and "pooling_mode_max_tokens" in result.error
