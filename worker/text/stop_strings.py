"""Finds stop strings in streamed text, holding back any tail that could still become one."""

from __future__ import annotations


class StopStringMatcher:
    """One per request. The emitted text ends just before the first stop string, or just after it when
    `include_stop` is true (vLLM's include_stop_str_in_output)."""

    def __init__(self, stops: tuple[str, ...], include_stop: bool = False) -> None:
        if any(not stop for stop in stops):
            raise ValueError("stop strings must not be empty")
        self._stops = stops
        self._include_stop = include_stop
        self._held = ""
        self.is_stopped = False

    @property
    def has_stop_strings(self) -> bool:
        return bool(self._stops)

    def feed(self, new_text: str) -> tuple[str, bool]:
        """Returns (text safe to emit now, whether a stop string has been reached)."""
        if self.is_stopped:
            return "", True
        if not self._stops:  # most requests: nothing to find or hold back
            return new_text, False
        text = self._held + new_text
        stop_at = self._find_first_stop(text)
        if stop_at is not None:
            self._held = ""
            self.is_stopped = True
            return text[: stop_at[1] if self._include_stop else stop_at[0]], True
        num_held = self._longest_partial_stop(text)
        self._held = text[len(text) - num_held :]
        return text[: len(text) - num_held], False

    def flush(self) -> str:
        """Returns the held-back text when generation ended without completing a stop string."""
        held, self._held = self._held, ""
        return held

    def _find_first_stop(self, text: str) -> tuple[int, int] | None:
        """Where the first stop string in `text` starts and ends."""
        found = [(index, index + len(stop)) for stop in self._stops if (index := text.find(stop)) >= 0]
        return min(found, default=None)

    def _longest_partial_stop(self, text: str) -> int:
        """Length of the longest suffix of `text` that is a proper prefix of some stop string."""
        longest = 0
        for stop in self._stops:
            for length in range(min(len(stop) - 1, len(text)), longest, -1):
                if text.endswith(stop[:length]):
                    longest = length
                    break
        return longest
