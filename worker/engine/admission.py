"""What the engine checks before a request joins the batch: each failure is the request's error, not the worker's."""

from __future__ import annotations

from collections.abc import Collection

from worker.engine.interface import EngineRequest


def admission_error(
    request: EngineRequest, max_model_len: int, num_fitting_tokens: int, speculative_methods: Collection[str]
) -> str | None:
    """Why the request cannot run on this engine, or None. `num_fitting_tokens`: the most one request's sequence may
    hold in the KV pool; `speculative_methods`: the proposers the engine offers."""
    num_prompt_tokens = len(request.prompt_token_ids)
    sampling = request.sampling
    if num_prompt_tokens == 0:
        return "the prompt is empty"
    if num_prompt_tokens > max_model_len - 1:
        return (
            f"the prompt has {num_prompt_tokens} tokens; at most {max_model_len - 1} fit this model's context "
            f"of {max_model_len} tokens with one to generate"
        )
    if sampling.max_tokens < 0:
        return f"max_tokens must be at least 0, got {sampling.max_tokens}"
    method = sampling.speculative_method
    if method not in (None, "none", *speculative_methods):
        offered = ", ".join(sorted(speculative_methods))
        return f"speculative method {method!r} is not available on this worker (it offers {offered}, none)"
    num_needed = min(num_prompt_tokens + sampling.max_tokens, max_model_len)
    if num_needed > num_fitting_tokens:
        return f"the request needs {num_needed} tokens of KV cache; the pool holds {num_fitting_tokens}"
    return None
