"""The supervisor's backoff: quick deaths wait 1, 2, 4 ... seconds up to a minute; a child that stayed up a while
starts again at once."""

from __future__ import annotations

from scripts.supervisor import FIRST_DELAY_S, MAX_DELAY_S, STABLE_AFTER_S, Backoff


def test_quick_deaths_double_the_delay_up_to_the_cap() -> None:
    backoff = Backoff(started_at=0.0)
    delays = []
    for _ in range(8):
        delays.append(backoff.delay_after_death(now=1.0))
        backoff.restarted(now=1.0)
    assert delays == [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 60.0, 60.0]
    assert max(delays) == MAX_DELAY_S


def test_a_child_that_stayed_up_starts_again_after_the_first_delay() -> None:
    backoff = Backoff(started_at=0.0)
    for _ in range(4):
        backoff.delay_after_death(now=1.0)
    backoff.restarted(now=10.0)
    assert backoff.delay_after_death(now=10.0 + STABLE_AFTER_S) == FIRST_DELAY_S
