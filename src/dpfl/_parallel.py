"""Independent computations on the machine's cores, in forked processes.

``dpfl account`` and ``dpfl calibrate`` price a scheme under each of its
analyses; the analyses share nothing, and one of them (a composed PLD per
noise multiplier tried) can take most of the command's time. :func:`map_ordered`
runs them side by side, one forked worker per core, and returns the results
in order, so a table of five analyses takes about as long as its slowest
row rather than their sum.

Forking keeps it cheap and lets the computations be closures (only the items
and the results cross between processes, pickled): the workers start with
the parent's imports and caches. Where fork is not the platform's safe
default (only Linux uses it here), on one core, for one item, or inside a
worker, the items run one after the other in the calling process. An
exception in a worker is raised in the caller; an exception in the caller
(a time limit, an interrupt) terminates the workers.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

__all__ = ["cores", "map_ordered"]

T = TypeVar("T")
R = TypeVar("R")

#: The function the forked workers apply (set before they are forked).
_JOB: Callable[[Any], Any] | None = None
#: True inside a worker: nested calls run serially (workers have no children).
_IN_WORKER = False


def cores() -> int:
    """The CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def _call(item: Any) -> Any:
    global _IN_WORKER
    _IN_WORKER = True
    assert _JOB is not None
    return _JOB(item)


def map_ordered(
    function: Callable[[T], R], items: Iterable[T], *, workers: int | None = None
) -> list[R]:
    """``[function(x) for x in items]``, the items spread over forked workers.

    Parameters
    ----------
    function : callable
        Applied to each item; any callable (a closure too). Its items and
        results must be picklable.
    items : iterable
        The inputs, handed to idle workers in order (put the longest first).
    workers : int, optional
        At most this many processes (default: one per core).

    Returns
    -------
    list
        The results, in the order of ``items``.
    """
    global _JOB
    todo = list(items)
    n = min(len(todo), workers if workers is not None else cores())
    if n <= 1 or _IN_WORKER or not sys.platform.startswith("linux"):
        return [function(x) for x in todo]
    _JOB = function
    try:
        with multiprocessing.get_context("fork").Pool(n) as pool:
            return pool.map(_call, todo, chunksize=1)
    finally:
        _JOB = None
