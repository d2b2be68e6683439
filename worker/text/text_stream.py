"""Token ids to the text a client may see: incremental detokenization, then stop strings."""

from __future__ import annotations

from transformers import PreTrainedTokenizerFast

from tasks.messages.generation import SamplingParams
from worker.text.detokenizer import IncrementalDetokenizer
from worker.text.stop_strings import StopStringMatcher


class TextStream:
    def __init__(self, tokenizer: PreTrainedTokenizerFast, prompt_ids: list[int], sampling: SamplingParams) -> None:
        self._detokenizer = IncrementalDetokenizer(tokenizer, prompt_ids, sampling.skip_special_tokens)
        self._stops = StopStringMatcher(sampling.stop, sampling.include_stop_str_in_output)
        self._include_stop_token = sampling.include_stop_str_in_output
        self.text = ""

    @property
    def is_stopped(self) -> bool:
        return self._stops.is_stopped

    @property
    def has_stop_strings(self) -> bool:
        return self._stops.has_stop_strings

    def push(self, token_ids: list[int], is_stop_token_last: bool = False) -> str:
        """The new text safe to show; is_stopped turns true when a stop string appeared. A stop token (EOS or a stop
        token id) that ended generation shows no text unless include_stop_str_in_output, as in vLLM."""
        if is_stop_token_last and not self._include_stop_token:
            token_ids = token_ids[:-1]
        new_text, _ = self._stops.feed(self._detokenizer.push(token_ids))
        self.text += new_text
        return new_text

    def flush(self) -> str:
        """Held-back text, once generation has ended (none after a stop string)."""
        tail = self._stops.flush()
        self.text += tail
        return tail
