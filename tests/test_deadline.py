"""The time limit on accounting work holds even where its exception is swallowed."""

from __future__ import annotations

import time

import pytest

from dpfl._deadline import TimeLimitExceeded, time_limit


def test_a_block_past_its_limit_is_stopped() -> None:
    start = time.monotonic()
    with (
        pytest.raises(TimeLimitExceeded, match="too slow"),
        time_limit(0.05, "too slow"),
    ):
        time.sleep(5)
    assert time.monotonic() - start < 2


def test_a_block_that_swallows_its_alarm_is_refused_when_it_ends() -> None:
    # Code that catches everything (a fork handler does) must not turn a late
    # answer into an accepted one.
    swallowed = 0
    with pytest.raises(TimeLimitExceeded), time_limit(0.02, "too slow"):
        try:
            time.sleep(5)
        except TimeLimitExceeded:
            swallowed += 1
    assert swallowed == 1


def test_a_block_within_its_limit_answers_and_leaves_no_alarm() -> None:
    import signal

    with time_limit(5.0, "too slow"):
        value = sum(range(100))
    assert value == 4950
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
