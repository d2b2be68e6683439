from __future__ import annotations

import pytest

from worker.text.stop_strings import StopStringMatcher


def feed_all(matcher: StopStringMatcher, chunks: list[str]) -> tuple[str, bool]:
    emitted = []
    for chunk in chunks:
        text, is_stopped = matcher.feed(chunk)
        emitted.append(text)
        if is_stopped:
            return "".join(emitted), True
    return "".join(emitted) + matcher.flush(), False


def test_no_stops_emits_everything_at_once() -> None:
    matcher = StopStringMatcher(())
    assert matcher.feed("hello ") == ("hello ", False)
    assert matcher.feed("world") == ("world", False)
    assert matcher.flush() == ""


def test_holds_back_a_possible_stop_across_chunks() -> None:
    matcher = StopStringMatcher(("\n\nUser:",))
    assert matcher.feed("Hi there\n") == ("Hi there", False)
    assert matcher.feed("\nUs") == ("", False)
    assert matcher.feed("er:") == ("", True)


def test_stop_completed_by_the_next_chunk() -> None:
    matcher = StopStringMatcher(("END",))
    assert matcher.feed("the EN") == ("the ", False)
    assert matcher.feed("Ds and more") == ("", True)


def test_partial_prefix_released_on_mismatch() -> None:
    matcher = StopStringMatcher(("END",))
    assert matcher.feed("an E") == ("an ", False)
    assert matcher.feed("gg") == ("Egg", False)


def test_stop_at_the_start() -> None:
    matcher = StopStringMatcher(("###",))
    assert matcher.feed("### and more") == ("", True)
    assert matcher.feed("anything") == ("", True)


def test_text_after_the_stop_in_the_same_chunk_is_dropped() -> None:
    assert feed_all(StopStringMatcher(("stop",)), ["one two stop three"]) == ("one two ", True)


def test_earliest_of_multiple_stops_wins() -> None:
    matcher = StopStringMatcher(("world", "lo w"))
    assert feed_all(matcher, ["hel", "lo wor", "ld"]) == ("hel", True)


def test_multiple_stops_hold_back_the_longest_possible_prefix() -> None:
    matcher = StopStringMatcher(("ab", "xabc"))
    assert matcher.feed("zxa") == ("z", False)
    assert matcher.feed("bq") == ("x", True)


def test_flush_returns_held_text_when_generation_ends() -> None:
    assert feed_all(StopStringMatcher(("</answer>",)), ["42 </ans"]) == ("42 </ans", False)


def test_empty_stop_string_is_rejected() -> None:
    with pytest.raises(ValueError, match="empty"):
        StopStringMatcher(("ok", ""))


def test_include_stop_keeps_the_stop_string_and_nothing_after_it() -> None:
    matcher = StopStringMatcher(("world", "lo w"), include_stop=True)
    assert feed_all(matcher, ["hel", "lo wor", "ld and more"]) == ("hello w", True)
    assert feed_all(StopStringMatcher(("END",), include_stop=True), ["a EN", "D b"]) == ("a END", True)
