"""A step's sampled tokens and the logprobs its rows asked for, computed on the device and read back in one transfer.

Logprobs are those of the model's raw distribution (before penalties and temperature), as vLLM reports by default;
for a constrained row, renormalised over the tokens its grammar allows, whose masked tokens leave its top lists.
"""

from __future__ import annotations

import torch

from tasks.messages.generation import TokenLogprob
from worker.engine.grammar.masks import NEG_INF
from worker.engine.transfers import to_device, to_host


def read_back(
    tokens: torch.Tensor,  # [S] int64: the step's picked tokens, on the device
    raw_logits: torch.Tensor,  # [S, V] float: the model's logits, before penalties and temperature
    num_logprobs: list[int | None],  # [S]: each row's `logprobs` (top entries wanted), None where it asked for none
) -> tuple[list[int], list[TokenLogprob | None]]:
    """The token ids, and per row its TokenLogprob (None where the row asked for none)."""
    wanted = [i for i, num in enumerate(num_logprobs) if num is not None]
    if not wanted:
        (host_tokens,) = to_host(tokens)
        return host_tokens.tolist(), [None] * len(num_logprobs)
    index = to_device(wanted, torch.int64, raw_logits.device)
    logprobs = raw_logits.index_select(0, index).log_softmax(dim=-1)  # [W, V]
    chosen = logprobs.gather(1, tokens.index_select(0, index)[:, None])[:, 0]  # [W]
    num_top = max(num_logprobs[i] or 0 for i in wanted)
    top_values, top_ids = logprobs.topk(num_top, dim=-1) if num_top else (logprobs[:, :0], logprobs[:, :0].long())
    host_tokens, host_chosen, host_values, host_ids = to_host(tokens, chosen, top_values, top_ids)
    token_ids, chosen_values = host_tokens.tolist(), host_chosen.tolist()
    top_values_list, top_ids_list = host_values.tolist(), host_ids.tolist()  # [W, num_top] each
    result: list[TokenLogprob | None] = [None] * len(num_logprobs)
    for position, i in enumerate(wanted):
        k = num_logprobs[i] or 0
        pairs = zip(top_ids_list[position][:k], top_values_list[position][:k], strict=True)
        top = tuple((token_id, value) for token_id, value in pairs if value != NEG_INF)  # a grammar's masked tokens
        result[i] = TokenLogprob(token_ids[i], chosen_values[position], top)
    return token_ids, result
