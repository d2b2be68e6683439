"""How the engine's parts are configured from the worker's one Config."""

from __future__ import annotations

from scheduler.scheduler import SchedulerConfig
from tasks.config import Config
from worker.engine.attention.kv_pool import every_layer_window
from worker.engine.grammar.compiler import GrammarCompiler
from worker.engine.model_runner import ModelRunner
from worker.engine.speculation.speculator import SpeculationConfig


def scheduler_config(config: Config, runner: ModelRunner) -> SchedulerConfig:
    return SchedulerConfig(
        max_num_seqs=config.max_num_seqs,
        max_num_batched_tokens=config.max_num_batched_tokens,
        prefill_chunk_size=min(config.prefill_chunk_size, config.max_num_batched_tokens),
        max_model_len=runner.max_model_len,
        num_blocks=runner.kv_pool.num_blocks,
        block_size=runner.kv_pool.block_size,
        enable_prefix_caching=config.enable_prefix_caching,
        # a draft model catches up on a request's tokens from its first, in the same blocks: none may be freed then
        sliding_window=every_layer_window(runner.kv_pool) if runner.draft_kv_pool is None else None,
    )


def grammar_compiler(config: Config, runner: ModelRunner) -> GrammarCompiler:
    vocab_size = runner.model.config.get_text_config().vocab_size  # the logits' width
    return GrammarCompiler(
        config.model, vocab_size, runner.eos_token_ids, config.grammar_compile_timeout_s, config.grammar_cache_size
    )


def speculation_config(config: Config) -> SpeculationConfig:
    return SpeculationConfig(
        max_batch_size=config.spec_max_batch_size,
        min_acceptance=config.spec_min_acceptance,
    )
