"""A constrained row's grammar state: it advances only on tokens the scheduler appended, so a preempted row (whose
appended tokens are kept and recomputed) resumes with its matcher exactly where its text is."""

from __future__ import annotations

import torch
import xgrammar as xgr

_batch_filler = xgr.BatchGrammarMatcher(max_threads="auto")


class RowGrammar:
    def __init__(self, compiled: xgr.CompiledGrammar) -> None:
        self.matcher = xgr.GrammarMatcher(compiled)

    def accept(self, token_ids: list[int]) -> bool:
        """False when the grammar refuses a token, which masked sampling never picks."""
        return all(self.matcher.accept_token(token_id) for token_id in token_ids)


def fill_bitmasks(grammars: list[RowGrammar], vocab_size: int) -> torch.Tensor:
    """The allowed next tokens of each grammar, [G, ceil(V / 32)] int32 on the CPU: bit j of word w allows token
    32 w + j."""
    bitmask = xgr.allocate_token_bitmask(len(grammars), vocab_size)
    _batch_filler.batch_fill_next_token_bitmask([grammar.matcher for grammar in grammars], bitmask)
    return bitmask
