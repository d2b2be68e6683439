"""SamplingParams from a validated request body: the one place chat, completions and batch lines build them."""

from __future__ import annotations

from api.chat.prompts import resolve_max_tokens
from api.chat.schemas import GenerationFields
from api.errors import APIError
from api.models.model_info import ModelInfo
from tasks.messages.generation import SamplingParams

# Below this a temperature is greedy, as in vLLM: dividing logits by a float32 denormal (or 0) gives inf and NaN.
MIN_TEMPERATURE = 1e-5


def prompts_sampling_params(info: ModelInfo, fields: GenerationFields, prompts: list[list[int]]) -> SamplingParams:
    """The sampling of every prompt of a request: each must fit the context with max_tokens, so the longest decides
    (and, with no max_tokens, leaves the rest of the context to all); a failure names that prompt."""
    longest = max(range(len(prompts)), key=lambda index: len(prompts[index]))
    try:
        return sampling_params(info, fields, len(prompts[longest]))
    except APIError as exc:
        if len(prompts) == 1 or exc.info.code != "context_length_exceeded":
            raise
        raise APIError(400, f"prompt {longest}: {exc.info.message}", param="prompt", code=exc.info.code) from exc


def sampling_params(info: ModelInfo, fields: GenerationFields, num_prompt_tokens: int) -> SamplingParams:
    """Raises APIError (400, with `param`) for values that only make sense against the model or each other."""
    if fields.requested_max_tokens == 0 and not fields.echoes_prompt:
        raise APIError(400, "max_tokens may be 0 only with echo (to score the prompt)", param="max_tokens")
    max_tokens = resolve_max_tokens(info, num_prompt_tokens, fields.requested_max_tokens)
    if fields.min_tokens > max_tokens:
        raise APIError(400, f"min_tokens ({fields.min_tokens}) exceeds max_tokens ({max_tokens})", param="min_tokens")
    if fields.speculative and fields.speculative.method not in info.speculative_methods:
        offered = ", ".join(sorted(info.speculative_methods))
        message = f"speculative method {fields.speculative.method!r} is not available here; use one of {offered}"
        raise APIError(400, message, param="speculative.method")
    vocab_size = len(info.tokenizer)
    if fields.top_k > vocab_size:  # the sampler builds a tensor of it: 10**30 would fail the whole engine step
        raise APIError(
            400, f"top_k must be -1 or 0 (off), or at most the {vocab_size} tokens of the vocabulary", param="top_k"
        )
    stop_token_ids = tuple(fields.stop_token_ids or ())
    if any(not 0 <= token < vocab_size for token in stop_token_ids):
        raise APIError(400, f"stop_token_ids must lie in [0, {vocab_size})", param="stop_token_ids")
    return SamplingParams(
        logit_bias=_logit_bias(fields.logit_bias, vocab_size),
        prompt_logprobs=fields.num_prompt_logprobs,
        max_tokens=max_tokens,
        temperature=0.0 if fields.temperature < MIN_TEMPERATURE else fields.temperature,
        top_p=fields.top_p,
        seed=fields.seed,
        stop=fields.stop_strings,
        stop_token_ids=stop_token_ids,
        ignore_eos=fields.ignore_eos,
        top_k=max(fields.top_k, 0),
        min_p=fields.min_p,
        repetition_penalty=fields.repetition_penalty,
        presence_penalty=fields.presence_penalty,
        frequency_penalty=fields.frequency_penalty,
        min_tokens=fields.min_tokens,
        logprobs=fields.num_logprobs,
        speculative_method=fields.speculative.method if fields.speculative else None,
        num_speculative_tokens=fields.speculative.num_tokens if fields.speculative else None,
        skip_special_tokens=fields.skip_special_tokens,
        include_stop_str_in_output=fields.include_stop_str_in_output,
    )


def _logit_bias(logit_bias: dict[str, float] | None, vocab_size: int) -> tuple[tuple[int, float], ...]:
    """(token id, bias) pairs from OpenAI's map, whose keys are token ids as strings (the schema checks the biases)."""
    pairs = []
    for key, bias in (logit_bias or {}).items():
        token_id = int(key) if key.isascii() and key.isdigit() else -1
        if not 0 <= token_id < vocab_size:
            message = f"logit_bias keys must be token ids in [0, {vocab_size}), got {key!r}"
            raise APIError(400, message, param="logit_bias", code="invalid_value")
        pairs.append((token_id, float(bias)))
    return tuple(pairs)
