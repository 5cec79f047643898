"""Executors: how a round's client steps are run.

``loop``
    One client at a time through
    :meth:`~dpfl.sim.algorithms.base.FederatedAlgorithm.client_step`: the
    reference, and the shape of one client in a real federation.
``batched``
    The whole cohort as one vectorised computation through
    :meth:`~dpfl.sim.algorithms.base.FederatedAlgorithm.client_steps` (the
    fast kernels of :mod:`dpfl.sim.grad` and :mod:`dpfl.sim.local`).

Every client draws from its own generators (:mod:`dpfl.sim.randomness`), so
both give the same messages up to floating-point rounding, and the same
ledger exactly; the contract tests check it for every algorithm.

``ray``
    The cohort cut into shares run by Ray actors, on this machine or a
    cluster (:class:`dpfl.integrations.ray.RayExecutor`; the optional extra
    ``pip install 'dpfl[ray]'``, imported only when asked for).

A distributed executor (:mod:`dpfl.integrations.ray`) has the same ``run``:
it cuts the cohort into consecutive shares (:func:`shares`), runs each on a
replica of the algorithm (built from its
:meth:`~dpfl.sim.algorithms.base.FederatedAlgorithm.blueprint`) with that
share's streams (:meth:`~dpfl.sim.randomness.CohortStreams.part`),
and joins the results in task order
(:meth:`~dpfl.sim.algorithms.base.Messages.concat`). A client step reads
mutable facts only from its task, so every split gives the same messages.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

from dpfl.errors import InvalidParameterError

if TYPE_CHECKING:
    import torch

    from dpfl.sim.algorithms.base import FederatedAlgorithm, Messages
    from dpfl.sim.algorithms.tasks import Task
    from dpfl.sim.randomness import Streams

__all__ = [
    "EXECUTION_NAMES",
    "EXECUTORS",
    "EXTERNAL_EXECUTORS",
    "BatchedExecutor",
    "Executor",
    "LoopExecutor",
    "executor",
    "shares",
]


class Executor(Protocol):
    """Runs a round's client steps and returns their stacked messages."""

    name: str

    def run(
        self,
        algorithm: FederatedAlgorithm,
        weights: torch.Tensor,
        tasks: Sequence[Task],
        streams: Sequence[Streams],
    ) -> Messages:
        """The messages of ``tasks``, in task order."""
        ...


class LoopExecutor:
    """One client at a time, in this process (the reference)."""

    name = "loop"

    def run(
        self,
        algorithm: FederatedAlgorithm,
        weights: torch.Tensor,
        tasks: Sequence[Task],
        streams: Sequence[Streams],
    ) -> Messages:
        """Run each task's client step and stack the messages."""
        from dpfl.sim.algorithms.base import Messages

        return Messages.stack(
            [algorithm.client_step(weights, t, s) for t, s in zip(tasks, streams)],
            weights,
        )


class BatchedExecutor:
    """The cohort as one vectorised computation, in this process."""

    name = "batched"

    def run(
        self,
        algorithm: FederatedAlgorithm,
        weights: torch.Tensor,
        tasks: Sequence[Task],
        streams: Sequence[Streams],
    ) -> Messages:
        """Run the algorithm's batched client steps."""
        return algorithm.client_steps(weights, tasks, streams)


def shares(num_tasks: int, num_workers: int) -> list[tuple[int, int]]:
    """Split ``num_tasks`` tasks into at most ``num_workers`` consecutive shares.

    Shares differ in size by at most one and none is empty; ``[]`` when there
    is no task.

    Examples
    --------
    >>> shares(5, 2)
    [(0, 3), (3, 5)]
    >>> shares(1, 4)
    [(0, 1)]
    """
    if num_workers < 1:
        raise InvalidParameterError(f"num_workers must be >= 1; got {num_workers!r}")
    n = min(num_tasks, num_workers)
    bounds = [num_tasks * i // n for i in range(n + 1)] if n else []
    return list(zip(bounds[:-1], bounds[1:]))


#: Executors by the name ``execution:`` takes in a run configuration.
EXECUTORS: dict[str, type[Executor]] = {
    LoopExecutor.name: LoopExecutor,
    BatchedExecutor.name: BatchedExecutor,
}


#: Executors of the optional integrations, by name: ``"module:class"``,
#: imported only when asked for (nothing here imports Ray).
EXTERNAL_EXECUTORS: dict[str, str] = {
    "ray": "dpfl.integrations.ray:RayExecutor",
}

#: Every name ``execution:`` takes.
EXECUTION_NAMES: tuple[str, ...] = (*EXECUTORS, *EXTERNAL_EXECUTORS)


def executor(name: str, **options: Any) -> Executor:
    """A new executor by name (``"loop"``, ``"batched"`` or ``"ray"``).

    The one way an executor is found by name: an integration's executor
    (:data:`EXTERNAL_EXECUTORS`) is imported only here, when asked for, so
    nothing that names it imports the integration.

    Parameters
    ----------
    name : str
        One of :data:`EXECUTION_NAMES`.
    **options
        The executor's own settings, passed to its constructor (e.g.
        ``"ray"``: ``address``, ``num_workers``, ``num_cpus_per_worker``,
        ``num_gpus_per_worker``: :class:`~dpfl.integrations.ray.RayExecutor`);
        without them, its defaults (for ``"ray"``: a local instance, one
        worker). Close a distributed executor when done.

    Raises
    ------
    dpfl.errors.InvalidParameterError
        If ``name`` is not one of :data:`EXECUTION_NAMES`, or options are
        given to an executor that takes none.
    """
    cls = EXECUTORS.get(name)
    if cls is not None:
        if options:
            raise InvalidParameterError(
                f"execution {name!r} takes no options; got {sorted(options)}"
            )
        return cls()
    path = EXTERNAL_EXECUTORS.get(name)
    if path is None:
        raise InvalidParameterError(
            f"execution must be one of {sorted(EXECUTION_NAMES)}; got {name!r}"
        )
    module, _, attr = path.partition(":")
    made: Executor = getattr(importlib.import_module(module), attr)(**options)
    return made
