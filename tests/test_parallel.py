"""dpfl._parallel: ordered results from forked workers, errors and limits kept."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from dpfl._deadline import TimeLimitExceeded, time_limit
from dpfl._parallel import map_ordered
from dpfl.errors import DpflError

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="workers are forked on Linux only"
)


def test_results_come_back_in_order_from_other_processes() -> None:
    offset = 10  # a closure: forked workers need not pickle the function
    out = map_ordered(lambda x: (x + offset, os.getpid()), range(6), workers=2)
    assert [v for v, _ in out] == list(range(10, 16))
    assert {pid for _, pid in out} - {os.getpid()}  # not all run here


def test_one_item_or_one_worker_runs_here() -> None:
    assert map_ordered(lambda x: os.getpid(), [1]) == [os.getpid()]
    assert map_ordered(lambda x: os.getpid(), [1, 2], workers=1) == [os.getpid()] * 2


def test_a_workers_error_is_raised_in_the_caller() -> None:
    def job(x: int) -> int:
        if x == 2:
            raise DpflError(f"no noise multiplier meets item {x}")
        return x

    with pytest.raises(DpflError, match="meets item 2"):
        map_ordered(job, range(4), workers=2)


def test_nested_calls_run_in_the_worker() -> None:
    # pool workers may not have children: an inner map runs serially there
    out = map_ordered(
        lambda x: map_ordered(lambda y: y * x, range(3), workers=2), [1, 2], workers=2
    )
    assert out == [[0, 1, 2], [0, 2, 4]]


def test_a_time_limit_in_the_caller_stops_the_workers(tmp_path: Path) -> None:
    def job(x: int) -> int:
        (tmp_path / f"{os.getpid()}.pid").write_text("")
        time.sleep(30)
        return x

    start = time.monotonic()
    with pytest.raises(TimeLimitExceeded), time_limit(1.0, "too slow"):
        map_ordered(job, range(2), workers=2)
    assert time.monotonic() - start < 10  # not the workers' 30 s
    pids = [int(p.stem) for p in tmp_path.glob("*.pid")]
    assert pids
    for pid in pids:  # terminated and reaped
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
