"""A round's work as the server hands it out, and one client's reply.

The server's :meth:`~dpfl.sim.algorithms.base.FederatedAlgorithm.select`
returns a :class:`Cohort` of :class:`Task` (one per client that computes); a
client step returns a :class:`Message`. A cohort's messages travel stacked as
:class:`~dpfl.sim.algorithms.base.Messages` to the server step.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

__all__ = ["Cohort", "Message", "Task"]


# -- a round's work and messages --------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Task:
    """One client's work in a round, as the server hands it out.

    Attributes
    ----------
    client : int
        The client's index (its random streams are keyed by it).
    rows : numpy.ndarray or None
        Global dataset rows the client uses this round (``None``: the
        client's own choice, from its whole data, with its own generators).
    options : mapping
        Anything else the server sends (a clip bound, a weight, ...).
    state : mapping of str to torch.Tensor
        The state the client holds between rounds (a helper model, optimiser
        moments, a private part), as the server's copy hands it to the client.
        A client step reads mutable facts only from its task: a replica of the
        algorithm built once (a Ray worker, a Flower client) computes the same
        message as the server's own object.
    """

    client: int
    rows: np.ndarray | None = None
    options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    state: Mapping[str, torch.Tensor] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class Cohort:
    """The server's plan for one round.

    Attributes
    ----------
    participants : numpy.ndarray
        Clients that take part (charged to the ledger when the guarantee is
        per client).
    tasks : list of Task
        The work handed out, one task per client that computes.
    info : dict
        What the server step needs besides the messages.
    """

    participants: np.ndarray
    tasks: list[Task]
    info: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class Message:
    """What one client sends: a flat vector and named scalars.

    ``state`` is the client's new held state (the :attr:`Task.state` of its
    next round), which the server step commits.
    """

    vector: torch.Tensor
    scalars: dict[str, float] = dataclasses.field(default_factory=dict)
    state: dict[str, torch.Tensor] = dataclasses.field(default_factory=dict)
