"""KV blocks a long context holds under sliding-window attention: our engine's pool against the full-attention count.

One request of `--prompt-len` random tokens plus `--output-len` greedy tokens, alone in the engine, on a random-init
Mistral shape (every layer slides by `--window`) and a Gemma 3 shape (five sliding layers, then a full one). At each
decoded token the bench reads the blocks requests hold; the full-attention count is the blocks of every computed
token. A model whose every layer slides gives back the blocks before the window as it goes; a model with a full layer
keeps them all, since one block holds every layer's K/V of its tokens.

    .venv/bin/python -m bench.features.sliding_window_blocks [--prompt-len 4096] [--output-len 32] [--window 512]
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import tempfile
import threading
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM

from tasks.config import REPO_ROOT, Config
from tasks.logs import configure_logging
from tasks.messages.generation import SamplingParams
from worker.engine.continuous_engine import ContinuousEngine
from worker.engine.interface import EngineOutput, EngineRequest
from worker.engine.model_runner import ModelRunner

logger = logging.getLogger(__name__)
TINY_CONFIG = REPO_ROOT / "models" / "tiny" / "config.json"
SHAPE = {  # small enough that a 4,096-token prefill takes seconds on a CPU; the block counts do not depend on it
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 6,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "max_position_embeddings": 32768,
}
FAMILIES = {"mistral": {}, "gemma3_text": {"query_pre_attn_scalar": 64}}  # Gemma 3: HF's 5:1 pattern at 6 layers


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompt-len", type=int, default=4096)
    parser.add_argument("--output-len", type=int, default=32)
    parser.add_argument("--window", type=int, default=512)
    return parser.parse_args(argv)


def write_model(family: str, window: int, out: Path) -> Path:
    vocab = {key: json.loads(TINY_CONFIG.read_text())[key] for key in ("vocab_size", "bos_token_id", "eos_token_id")}
    config = AutoConfig.for_model(family, **SHAPE, **vocab, **FAMILIES[family], sliding_window=window)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(out)
    return out


def blocks_held_while_decoding(model_dir: Path, prompt: list[int], output_len: int) -> tuple[list[int], int]:
    """The blocks requests held at each decoded token, and the pool's block size."""
    config = Config(model=str(model_dir), device="cpu", kv_cache_tokens=len(prompt) + output_len + 1024)
    runner = ModelRunner(config)
    runner.eos_token_ids = frozenset()
    engine = ContinuousEngine(runner, config)
    held: list[int] = []
    finished = threading.Event()

    def record(output: EngineOutput) -> None:  # on the engine thread, between steps
        if output.is_finished:
            finished.set()
        else:
            held.append(engine.num_blocks - engine.num_free_blocks)

    engine.start()
    try:
        sampling = SamplingParams(max_tokens=output_len, temperature=0.0, speculative_method="none")
        engine.submit(EngineRequest("long", prompt, sampling), record)
        if not finished.wait(600):
            raise TimeoutError("the request did not finish in 600 s")
    finally:
        engine.stop(timeout_s=60)
    return held, runner.kv_pool.block_size


def main(argv: list[str] | None = None) -> None:
    configure_logging(Config())
    args = parse_args(argv)
    prompt = [random.Random(0).randrange(5, 2000) for _ in range(args.prompt_len)]
    rows = []
    with tempfile.TemporaryDirectory(prefix="steerbatch-window-") as scratch:
        for family in FAMILIES:
            model_dir = write_model(family, args.window, Path(scratch) / family)
            held, block_size = blocks_held_while_decoding(model_dir, prompt, args.output_len)
            full = -(-(args.prompt_len + args.output_len - 1) // block_size)  # every computed token's block
            rows.append((family, max(held), full))
    print(f"\n{args.prompt_len}-token prompt + {args.output_len} tokens, window {args.window}, blocks of {block_size}")
    print(f"{'model':<12} {'blocks held (max, decoding)':>28} {'full-attention blocks':>22} {'ratio':>7}")
    for family, peak, full in rows:
        print(f"{family:<12} {peak:>28} {full:>22} {peak / full:>7.3f}")


if __name__ == "__main__":
    main()
