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


def test_a_swallowed_alarm_fires_again() -> None:
    # Code that catches everything (a fork handler does) must not outlive the limit:
    # the first exception is swallowed, the repeat stops the block.
    swallowed = 0
    start = time.monotonic()
    with pytest.raises(TimeLimitExceeded), time_limit(0.05, "too slow"):
        try:
            time.sleep(5)
        except TimeLimitExceeded:
            swallowed += 1
        time.sleep(5)
    assert swallowed == 1
    assert time.monotonic() - start < 2


def test_a_block_that_swallows_every_alarm_is_refused_when_it_ends() -> None:
    with pytest.raises(TimeLimitExceeded), time_limit(0.02, "too slow"):
        for _ in range(20):
            try:
                time.sleep(0.05)
            except TimeLimitExceeded:
                pass


def test_a_block_within_its_limit_answers_and_leaves_no_alarm() -> None:
    import signal

    with time_limit(5.0, "too slow"):
        value = sum(range(100))
    assert value == 4950
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
