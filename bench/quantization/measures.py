"""What the quantization benchmark measures of one loaded variant: the bytes of its weights and KV pool, its decode
speed in the engine at a given concurrency, its greedy tokens, and its next-token log-probabilities over texts.

Log-probabilities come from the engine's own forward (ModelRunner.run with prompt logits kept), one text per step in
one prefill chunk whose attention reads the K/V it just stored: for a quantized pool, the codes."""

from __future__ import annotations

import math
import random

import torch

from bench.engines.steerbatch_engine import SteerbatchEngine
from bench.workload import BenchRequest
from scheduler.batch import Batch, ScheduledChunk
from scheduler.request import Request
from tasks.config import Config
from worker.engine.model_runner import ModelRunner


def tensor_bytes(tensor: torch.Tensor) -> int:
    """Bytes a tensor holds, through the inner tensors of a subclass (torchao's quantized weights)."""
    if hasattr(tensor, "__tensor_flatten__") and type(tensor) not in (torch.Tensor, torch.nn.Parameter):
        names, _ = tensor.__tensor_flatten__()
        return sum(tensor_bytes(getattr(tensor, name)) for name in names)
    return tensor.numel() * tensor.element_size()


def weight_bytes(model: torch.nn.Module) -> int:
    """Parameters and buffers (quantized weights, scales, zero points), each storage once."""
    seen: set[int] = set()
    total = 0
    for tensor in [*model.parameters(), *model.buffers()]:
        if id(tensor) not in seen:
            seen.add(id(tensor))
            total += tensor_bytes(tensor)
    return total


def random_prompts(num: int, length: int, vocab_size: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(5, vocab_size) for _ in range(length)] for _ in range(num)]


def run_requests(
    runner: ModelRunner, config: Config, prompts: list[list[int]], num_tokens: int
) -> list[tuple[list[int], list[float]]]:
    """Every prompt submitted at once to an engine over `runner`, decoded greedily for `num_tokens` (EOS ignored):
    each request's tokens and their times."""
    engine = SteerbatchEngine(runner, config)
    try:
        requests = [BenchRequest(f"q-{i}", prompt, num_tokens, 0.0) for i, prompt in enumerate(prompts)]
        result = engine.run("burst", requests)
    finally:
        engine.close()
    return [(trace.token_ids, trace.token_times) for trace in result.traces]


def decode_tokens_per_s(runs: list[tuple[list[int], list[float]]]) -> float:
    """Decode tokens (every token after each request's first) per second, from the first request's first token to
    the last request's last: prefill is left out."""
    num_tokens = sum(len(tokens) - 1 for tokens, _ in runs)
    span = max(times[-1] for _, times in runs) - min(times[0] for _, times in runs)
    return num_tokens / span


def text_logprobs(runner: ModelRunner, texts: list[list[int]]) -> list[torch.Tensor]:
    """Per text, log-probabilities [len - 1, V] of each next token, from the engine's forward over the KV pool."""
    block_size = runner.kv_pool.block_size
    results = []
    for text in texts:
        num_blocks = -(-len(text) // block_size)
        request = Request("text", text, max_tokens=1, block_table=list(range(num_blocks)))
        batch = Batch([ScheduledChunk(request, 0, len(text), is_sampling=True)])
        output = runner.run(batch, prompt_indices=list(range(len(text) - 1)))
        results.append(torch.log_softmax(output.prompt_logits.float(), dim=-1))
    return results


def perplexity(logprobs: list[torch.Tensor], texts: list[list[int]]) -> float:
    """exp of the mean negative log-likelihood of every text's next tokens."""
    nll = [-lp.gather(1, torch.tensor(text[1:])[:, None]).sum() for lp, text in zip(logprobs, texts, strict=True)]
    return math.exp(float(sum(nll)) / sum(len(text) - 1 for text in texts))


def mean_kl(reference: list[torch.Tensor], measured: list[torch.Tensor]) -> float:
    """Mean over every position of KL(reference || measured) of the next-token distributions, in nats."""
    total = sum(float((ref.exp() * (ref - out)).sum()) for ref, out in zip(reference, measured, strict=True))
    return total / sum(ref.shape[0] for ref in reference)


def greedy_agreement(reference: list[list[int]], measured: list[list[int]]) -> float:
    """The fraction of reference tokens each run reproduces before its first different token (after one, the two
    continue from different texts, so later matches say nothing)."""
    matched = 0
    for ref, out in zip(reference, measured, strict=True):
        for expected, token in zip(ref, out, strict=False):
            if expected != token:
                break
            matched += 1
    return matched / sum(len(ref) for ref in reference)
