"""Token ids to the text a client may see: incremental detokenization, then stop strings."""

from __future__ import annotations

from transformers import PreTrainedTokenizerFast

from worker.detokenizer import IncrementalDetokenizer
from worker.stop_strings import StopStringMatcher


class TextStream:
    def __init__(self, tokenizer: PreTrainedTokenizerFast, prompt_ids: list[int], stops: tuple[str, ...]) -> None:
        self._detokenizer = IncrementalDetokenizer(tokenizer, prompt_ids)
        self._stops = StopStringMatcher(stops)
        self.text = ""
        self.is_stopped = False

    def push(self, token_ids: list[int]) -> str:
        """The new text safe to show; sets is_stopped when a stop string appeared."""
        new_text, self.is_stopped = self._stops.feed(self._detokenizer.push(token_ids))
        self.text += new_text
        return new_text

    def flush(self) -> str:
        """Held-back text, once generation has ended without a stop string."""
        tail = "" if self.is_stopped else self._stops.flush()
        self.text += tail
        return tail
