"""An embeddings body as the worker's request: each input tokenized and bounded, `dimensions` and steering checked
against the model; the interactive endpoint and the Batch API's lines both build it here."""

from __future__ import annotations

import time
import uuid

from api.chat.prompts import completion_prompt_ids
from api.embeddings.schemas import MAX_TOTAL_TOKENS, EmbeddingRequest
from api.errors import APIError
from api.models.model_info import ModelInfo
from api.steering.specs import steering_spec
from tasks.messages.embeddings import EmbedRequest


def build_embed_request(info: ModelInfo, embedding: EmbeddingRequest, tenant: str) -> EmbedRequest:
    """The worker's request: each input tokenized (as a completion's prompt) and no longer than the model's context,
    all of them within MAX_TOTAL_TOKENS; `dimensions` within the hidden size; steering checked against the SAEs."""
    inputs = []
    for index, text in enumerate(embedding.inputs):
        param = f"input.{index}" if embedding.is_list else "input"
        ids = completion_prompt_ids(info.tokenizer, text, param=param)
        if len(ids) > info.max_model_len:
            message = (
                f"This model's maximum context length is {info.max_model_len} tokens, however you requested "
                f"{len(ids)} tokens in this input."
            )
            raise APIError(400, message, param=param, code="context_length_exceeded")
        inputs.append(ids)
    num_tokens = sum(len(ids) for ids in inputs)
    if num_tokens > MAX_TOTAL_TOKENS:
        message = f"The inputs hold {num_tokens} tokens; at most {MAX_TOTAL_TOKENS} are allowed in one request."
        raise APIError(400, message, param="input", code="max_tokens_per_request")
    if embedding.dimensions is not None and info.hidden_size and embedding.dimensions > info.hidden_size:
        message = f"dimensions is at most the model's hidden size, {info.hidden_size}; it was {embedding.dimensions}."
        raise APIError(400, message, param="dimensions")
    return EmbedRequest(
        request_id="embd-" + uuid.uuid4().hex,
        model=info.name,
        inputs=inputs,
        created=int(time.time()),
        dimensions=embedding.dimensions,
        steering=None if embedding.steering is None else steering_spec(embedding.steering, info),
        tenant=tenant,
        encoding_format=embedding.encoding_format,
    )
