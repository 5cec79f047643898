"""Algorithms by name, and blueprints that build replicas of one.

:func:`register` makes an algorithm class buildable by its ``name``;
:data:`ALGORITHMS` is the only list of algorithm names and
:func:`algorithm_class` finds one (case and ``_``/``-`` ignored). A
:class:`Blueprint` holds an algorithm's constructor arguments, so a worker
(a Ray actor, a Flower client) builds a replica once and reuses it every
round.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import TYPE_CHECKING, Any, TypeVar

import torch
from torch import nn

from dpfl.data.dataset import FederatedDataset
from dpfl.errors import DpflError, InvalidParameterError

if TYPE_CHECKING:
    from dpfl.sim.algorithms.base import AlgorithmParams, FederatedAlgorithm

__all__ = ["ALGORITHMS", "Blueprint", "algorithm_class", "register"]


@dataclasses.dataclass(frozen=True)
class Blueprint:
    """The constructor arguments of an algorithm, to build replicas of it.

    Attributes
    ----------
    algorithm : str
        Registered name.
    params : AlgorithmParams
        Its parameters.
    model : torch.nn.Module
        A CPU copy of the model (the replica's weights are replaced by the
        ones each client step receives).
    dataset : FederatedDataset
        The data.
    options : dict
        The remaining keyword arguments (σ, ``max_clients``, ...).
    device : str
        The device of the algorithm it was taken from (where :meth:`build`
        puts a replica by default).
    """

    algorithm: str
    params: AlgorithmParams
    model: nn.Module
    dataset: FederatedDataset
    options: dict[str, Any]
    device: str = "cpu"

    def build(self, device: str | None = None) -> FederatedAlgorithm:
        """A new algorithm from this blueprint, on ``device``.

        Parameters
        ----------
        device : str or None
            The replica's torch device. ``None`` (default): the device of
            the algorithm the blueprint was taken from when this process has
            it (a replica in the same process or on a like machine computes
            where the original does), else the CPU.
        """
        if device is None:
            device = self.device if _device_present(self.device) else "cpu"
        cls = algorithm_class(self.algorithm)
        return cls(
            self.params,
            model=copy.deepcopy(self.model),
            dataset=self.dataset,
            device=device,
            **self.options,
        )


def _device_present(device: str) -> bool:
    """Whether this process can put tensors on ``device``."""
    try:
        torch.empty(0, device=device)
    except Exception:  # noqa: BLE001 - any refusal (not compiled, no such index)
        return False
    return True


# -- the registry -----------------------------------------------------------------
ALGORITHMS: dict[str, type[FederatedAlgorithm]] = {}


A = TypeVar("A", bound="type[FederatedAlgorithm]")


def register(cls: A) -> A:
    """Class decorator: make an algorithm buildable by its ``name``."""
    if cls.name in ALGORITHMS and ALGORITHMS[cls.name] is not cls:
        raise DpflError(f"an algorithm named {cls.name!r} is already registered")
    ALGORITHMS[cls.name] = cls
    return cls


def _key(name: str) -> str:
    return str(name).strip().lower().replace("_", "-")


def algorithm_class(name: str) -> type[FederatedAlgorithm]:
    """The registered algorithm called ``name`` (case and ``_``/``-`` ignored).

    Raises
    ------
    dpfl.errors.InvalidParameterError
        If no algorithm has that name (the message lists them).
    """
    import dpfl.sim.algorithms  # noqa: F401  (registers the built-in algorithms)

    cls = ALGORITHMS.get(_key(name))
    if cls is None:
        from difflib import get_close_matches

        close = get_close_matches(str(name), sorted(ALGORITHMS), n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise InvalidParameterError(
            f"algorithm must be one of {sorted(ALGORITHMS)}; got {name!r}{hint}"
        )
    return cls
