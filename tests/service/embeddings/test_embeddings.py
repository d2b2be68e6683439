"""/v1/embeddings through the real `openai` client against the real stack: each vector is what HF's own forward of
the same tokens gives (the decoder's last hidden state at the last token, L2-normalised, computed here in float32),
in float and base64 (the same float32 bytes); `dimensions` truncates and renormalises; steering adds the same delta
as a hook on HF's layer; bad input is a 400 naming its param."""

from __future__ import annotations

import base64
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest
import torch
import torch.nn.functional as F
from transformers import AutoModel, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from scripts.stack import Stack
from tests.service.chat.test_openai_client import client_for
from tests.service.http import auth

ATOL = 1e-5  # float32; the packed forward sums in another order than HF's
TEXTS = ["the dog ran", "a much longer sentence about a blue bird that sang all day", "x"]
HIDDEN_SIZE = 128  # the tiny model's


@pytest.fixture(scope="module")
def hf_decoder(tiny_model_dir: Path) -> PreTrainedModel:
    return AutoModel.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path) -> PreTrainedTokenizerBase:
    return AutoTokenizer.from_pretrained(tiny_model_dir)


def hf_vectors(model: PreTrainedModel, inputs: list[list[int]], dimensions: int | None = None) -> np.ndarray:
    with torch.no_grad():
        last = [model(torch.tensor([ids])).last_hidden_state[0, -1].float() for ids in inputs]
    return F.normalize(torch.stack(last)[:, :dimensions], dim=-1).numpy()


def test_float_and_base64_vectors_are_hf_last_hidden_states_normalised(
    stack: Stack, hf_decoder: PreTrainedModel, tokenizer: PreTrainedTokenizerBase
) -> None:
    client = client_for(stack)
    model = stack.config.model_name
    floats = client.embeddings.create(model=model, input=TEXTS, encoding_format="float", user="someone")
    ids = [tokenizer.encode(text) for text in TEXTS]
    assert [item.index for item in floats.data] == [0, 1, 2] and floats.model == model
    assert floats.usage.prompt_tokens == floats.usage.total_tokens == sum(map(len, ids))
    np.testing.assert_allclose(np.array([item.embedding for item in floats.data]), hf_vectors(hf_decoder, ids),
                               atol=ATOL, rtol=0)  # fmt: skip
    packed = client.embeddings.create(model=model, input=TEXTS, encoding_format="base64")
    decoded = [np.frombuffer(base64.b64decode(item.embedding), dtype="<f4") for item in packed.data]
    assert all(vector.tolist() == item.embedding for vector, item in zip(decoded, floats.data, strict=True))
    by_default = client.embeddings.create(model=model, input=TEXTS[0])  # the client asks for base64 and decodes it
    assert by_default.data[0].embedding == floats.data[0].embedding


def test_token_ids_and_dimensions(stack: Stack, hf_decoder: PreTrainedModel) -> None:
    client = client_for(stack)
    inputs = [[11, 12, 13, 14], [200, 7]]
    reply = client.embeddings.create(model=stack.config.model_name, input=inputs, dimensions=16,
                                     encoding_format="float")  # fmt: skip
    assert len(reply.data[0].embedding) == 16 and reply.usage.prompt_tokens == 6
    np.testing.assert_allclose(np.array([item.embedding for item in reply.data]), hf_vectors(hf_decoder, inputs, 16),
                               atol=ATOL, rtol=0)  # fmt: skip
    one = client.embeddings.create(model=stack.config.model_name, input=inputs[0], encoding_format="float")
    assert len(one.data) == 1 and one.usage.prompt_tokens == 4


def test_steering_adds_the_delta_hf_adds_with_a_hook(stack: Stack, hf_decoder: PreTrainedModel) -> None:
    values = [((i * 37) % 11 - 5) / 5 for i in range(HIDDEN_SIZE)]
    steering = {"vectors": [{"layer": 2, "strength": 3.0, "values": values}]}
    inputs = [[11, 12, 13, 14]]
    reply = client_for(stack).embeddings.create(
        model=stack.config.model_name, input=inputs, encoding_format="float", extra_body={"steering": steering}
    )
    handle = hf_decoder.layers[2].register_forward_hook(lambda m, a, output: output + 3.0 * torch.tensor(values))
    try:
        expected = hf_vectors(hf_decoder, inputs)
    finally:
        handle.remove()
    np.testing.assert_allclose(np.array([reply.data[0].embedding]), expected, atol=ATOL, rtol=0)
    assert np.abs(expected - hf_vectors(hf_decoder, inputs)).max() > 0.01


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"dimensions": HIDDEN_SIZE + 1}, "dimensions"),
        ({"dimensions": 0}, "dimensions"),
        ({"input": ""}, "input"),
        ({"input": ["fine", [3, 2048]]}, "input"),
        ({"input": [[3], [5, 2048]]}, "input.1"),
        ({"input": [[1] * 4097]}, "input.0"),
        ({"encoding_format": "int8"}, "encoding_format"),
        ({"pooling": "mean"}, "pooling"),
        ({"steering": {"vectors": [{"layer": 2, "strength": 1.0, "values": [1.0, 2.0]}]}}, "steering.vectors.0.values"),
    ],
)
def test_bad_input_is_a_400_naming_its_param(stack: Stack, fields: dict, param: str) -> None:
    body = {"model": stack.config.model_name, "input": "the dog", **fields}
    reply = httpx.post(f"{stack.base_url}/v1/embeddings", json=body, headers=auth(stack), timeout=60)
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["param"].startswith(param), reply.json()


def test_an_unknown_model_is_a_404_as_openai_answers(stack: Stack) -> None:
    with pytest.raises(openai.NotFoundError):
        client_for(stack).embeddings.create(model="no-such-model", input="x")
