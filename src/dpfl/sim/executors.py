"""Executors: how independent pieces of client work are run (injected).

An executor is "an object with a ``map`` method" (like emcee's ``pool``).
Algorithms that batch a whole round into one tensor computation (as
DP-DSGD with random participation does) need no executor; algorithms with
per-client local loops hand them to one. Ray is a later adapter with the same
method; results must not depend on the executor, because every task carries
its own seed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol, TypeVar

__all__ = ["Executor", "SerialExecutor"]

T = TypeVar("T")
R = TypeVar("R")


class Executor(Protocol):
    """Runs ``fn`` on each task and returns the results in task order."""

    def map(self, fn: Callable[[T], R], tasks: Sequence[T]) -> list[R]:
        """Return ``[fn(t) for t in tasks]``, possibly computed in parallel."""
        ...


class SerialExecutor:
    """Runs tasks one after another in this process.

    Examples
    --------
    >>> SerialExecutor().map(lambda x: x * x, [1, 2, 3])
    [1, 4, 9]
    """

    def map(self, fn: Callable[[T], R], tasks: Sequence[T]) -> list[R]:
        """Return ``[fn(t) for t in tasks]``.

        Parameters
        ----------
        fn : callable
            Function of one task.
        tasks : sequence
            The tasks.

        Returns
        -------
        list
            Results, in task order.
        """
        return [fn(t) for t in tasks]
