"""What a round hands around, and the helpers of the fit loop.

:class:`RoundPlan` (a round checked and selected, awaiting its messages) and
:class:`RoundReport` (what it did) are what :class:`~dpfl.sim.loop.Trainer`'s
``begin_round``, ``finish_round`` and ``step`` exchange with a driver;
:func:`weights_digest` is the digest of the model each ledger entry records;
:func:`deferred_interrupt` lets the fit loop finish the round in progress on
Ctrl-C.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import logging
import math
import signal
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np

from dpfl.accounting.events import Event
from dpfl.errors import (
    NonFiniteUpdateError,
)
from dpfl.sim.algorithms.tasks import Cohort
from dpfl.sim.randomness import CohortStreams, Streams

__all__ = ["RoundPlan", "RoundReport", "deferred_interrupt", "weights_digest"]

_log = logging.getLogger("dpfl.sim")


def weights_digest(weights: Any) -> str:
    """SHA-256 (hex) of a weight tensor: dtype, shape and bytes.

    Parameters
    ----------
    weights : torch.Tensor
        The tensor (any device and dtype).

    Returns
    -------
    str
        64 hex digits; equal tensors (bit for bit) give equal digests.
    """
    import torch

    flat = weights.detach().contiguous().reshape(-1)
    raw = flat.view(torch.uint8).cpu().numpy().tobytes()
    head = f"{flat.dtype}:{tuple(weights.shape)}:".encode()
    return hashlib.sha256(head + raw).hexdigest()


@dataclasses.dataclass
class RoundReport:
    """What one round did.

    Attributes
    ----------
    round : int
        Index of the round that ran (0-based; the ledger entry's ``round``).
    event : Event or None
        The accounting event charged (``None``: a non-private round, not
        charged).
    participants : numpy.ndarray
        The clients that took part.
    metrics : dict of str to float
        The algorithm's round metrics.
    """

    round: int
    event: Event | None
    participants: np.ndarray
    metrics: dict[str, float]


@dataclasses.dataclass
class RoundPlan:
    """A round checked against the budget and selected, awaiting its messages.

    Attributes
    ----------
    round : int
        The round's index.
    event : Event or None
        The event checked against the budget (``None``: non-private).
    server : Streams
        The server's generators of the round.
    cohort : Cohort
        The participants and their tasks.
    streams : CohortStreams
        Each task's client generators, in task order.
    """

    round: int
    event: Event | None
    server: Streams
    cohort: Cohort
    streams: CohortStreams


def _check_record(record: dict[str, Any]) -> None:
    """Refuse a round whose metrics are NaN or Inf (before any callback sees it).

    Raises
    ------
    dpfl.errors.NonFiniteUpdateError
        Naming the round and the metric; the round is neither written to the
        metrics file nor checkpointed.
    """
    for key, value in record.items():
        if key.startswith("epsilon") or not isinstance(value, float):
            continue
        if not math.isfinite(value):
            raise NonFiniteUpdateError(
                f"round {record['round']}: {key} is {value} (the model or its "
                "metrics are not finite); the run stops and the last checkpoint "
                "is kept"
            )


@contextlib.contextmanager
def deferred_interrupt(
    logger: logging.Logger | None = None,
) -> Iterator[dict[str, bool]]:
    """Turn the first Ctrl-C into a flag checked between rounds; a second aborts.

    Outside the main thread (where signals cannot be handled) the flag is
    never set.

    Parameters
    ----------
    logger : logging.Logger or None
        Where the "finishing this round" notice goes (default ``dpfl.sim``).

    Yields
    ------
    dict
        ``{"stop": bool}``, set to True by the first SIGINT.
    """
    flag = {"stop": False}
    if threading.current_thread() is not threading.main_thread():
        yield flag
        return
    log = logger if logger is not None else _log
    previous = signal.getsignal(signal.SIGINT)

    def handler(signum: int, frame: Any) -> None:
        if flag["stop"]:
            signal.signal(signal.SIGINT, signal.default_int_handler)
            raise KeyboardInterrupt
        flag["stop"] = True
        log.warning(
            "interrupt: finishing this round, then stopping (Ctrl-C again aborts)"
        )

    signal.signal(signal.SIGINT, handler)
    try:
        yield flag
    finally:
        signal.signal(signal.SIGINT, previous)
