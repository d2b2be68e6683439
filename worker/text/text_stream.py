"""Token ids to the text a client may see: incremental detokenization, then stop strings."""

from __future__ import annotations

from transformers import PreTrainedTokenizerFast

from worker.text.detokenizer import IncrementalDetokenizer
from worker.text.stop_strings import StopStringMatcher


class TextStream:
    def __init__(self, tokenizer: PreTrainedTokenizerFast, prompt_ids: list[int], stops: tuple[str, ...]) -> None:
        self._detokenizer = IncrementalDetokenizer(tokenizer, prompt_ids)
        self._stops = StopStringMatcher(stops)
        self.text = ""

    @property
    def is_stopped(self) -> bool:
        return self._stops.is_stopped

    def push(self, token_ids: list[int]) -> str:
        """The new text safe to show; is_stopped turns true when a stop string appeared."""
        new_text, _ = self._stops.feed(self._detokenizer.push(token_ids))
        self.text += new_text
        return new_text

    def flush(self) -> str:
        """Held-back text, once generation has ended (none after a stop string)."""
        tail = self._stops.flush()
        self.text += tail
        return tail
