"""flash-attn's paged kernel path on CUDA, against HF's own attention (skipped without a GPU and flash-attn)."""

from __future__ import annotations

import dataclasses
import importlib.util
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from scheduler.request import Request
from scheduler.scheduler import Scheduler
from tasks.config import Config
from worker.engine.continuous_engine import scheduler_config
from worker.engine.model_runner import ModelRunner

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
    pytest.mark.skipif(importlib.util.find_spec("flash_attn") is None, reason="needs flash-attn"),
]


def test_flash_paged_logits_match_hf_over_chunked_prefill_and_decode(tiny_model_dir: Path) -> None:
    config = Config(model=str(tiny_model_dir), device="cuda", dtype="bfloat16", kv_cache_tokens=8192)
    runner = ModelRunner(dataclasses.replace(config, prefill_chunk_size=64))
    assert runner.is_flash
    reference = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.bfloat16).to("cuda").eval()
    scheduler = Scheduler(dataclasses.replace(scheduler_config(config, runner), prefill_chunk_size=64))
    prompts = [list(range(5, 5 + n)) for n in (3, 150, 40)]
    requests = [Request(f"r{i}", prompt, max_tokens=6) for i, prompt in enumerate(prompts)]
    for request in requests:
        scheduler.add(request)
    while scheduler.has_work:
        batch = scheduler.schedule()
        logits = runner.run(batch)
        for chunk, row_logits in zip(batch.sampling_chunks, logits, strict=True):
            sequence = chunk.request.prompt_token_ids + chunk.request.output_token_ids
            with torch.no_grad():
                expected = reference(torch.tensor([sequence], device="cuda")).logits[0, -1].float()
            torch.testing.assert_close(row_logits, expected, atol=0.1, rtol=0.05)
        scheduler.update_from_output(batch, logits.argmax(-1).tolist())
