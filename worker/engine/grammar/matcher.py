"""A constrained row's grammar state, and the step's bitmasks of what each row may write next.

A row's matcher advances only on tokens the scheduler appended, so a preempted row (whose appended tokens are kept
and recomputed) resumes with its matcher exactly where its text is. Constrained rows never speculate, so each
appends one token a step; the matcher takes it at the start of the row's next sampling step, with that step's
fill, off the engine thread.
"""

from __future__ import annotations

import functools
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:  # xgrammar loads only where a grammar runs: a worker (or the GPU check) without one never needs it
    import xgrammar as xgr


@functools.cache
def _batch_matcher() -> xgr.BatchGrammarMatcher:
    import xgrammar as xgr

    return xgr.BatchGrammarMatcher(max_threads="auto")


class RowGrammar:
    def __init__(self, compiled: xgr.CompiledGrammar) -> None:
        import xgrammar as xgr

        self.matcher = xgr.GrammarMatcher(compiled)
        self.pending_token_id: int | None = None  # appended, not yet taken by the matcher
        self.refused_token_id: int | None = None  # a token the matcher refused (masked sampling never picks one)


def fill_bitmasks(grammars: list[RowGrammar], vocab_size: int) -> torch.Tensor:
    """Each grammar takes its pending token, then the allowed next tokens of each, [G, ceil(V / 32)] int32 on the
    CPU: bit j of word w allows token 32 w + j."""
    import xgrammar as xgr

    pending = [grammar for grammar in grammars if grammar.pending_token_id is not None]
    if pending:
        token_ids = [grammar.pending_token_id for grammar in pending]
        accepted = xgr.BatchGrammarMatcher.batch_accept_token([grammar.matcher for grammar in pending], token_ids)
        for grammar, token_id, is_accepted in zip(pending, token_ids, accepted, strict=True):
            grammar.pending_token_id = None
            if not is_accepted:
                grammar.refused_token_id = token_id
    bitmask = xgr.allocate_token_bitmask(len(grammars), vocab_size)
    _batch_matcher().batch_fill_next_token_bitmask([grammar.matcher for grammar in grammars], bitmask)
    return bitmask


class MaskFiller:
    """Fills a step's bitmasks on a thread of its own while the forward pass runs: the matchers only change after
    sampling, and xgrammar fills without the GIL, so the fill costs the step nothing on a spare core."""

    def __init__(self, vocab_size: int) -> None:
        self._vocab_size = vocab_size
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="grammar-masks")

    def start(self, grammars: list[RowGrammar]) -> Future[torch.Tensor] | None:
        """The bitmasks of `grammars`, in order; None when there are none to fill."""
        return self._pool.submit(fill_bitmasks, grammars, self._vocab_size) if grammars else None

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
