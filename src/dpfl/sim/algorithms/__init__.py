"""Federated algorithms by name: ``build_algorithm("dsgd-rp", model=..., dataset=...)``.

Each paper's system is one module here that reads like its pseudo-code over
the shared pieces (:mod:`dpfl.sim.sampling`, :mod:`dpfl.sim.grad`,
:mod:`dpfl.sim.local`, :mod:`dpfl.sim.privatize`); the
:class:`~dpfl.sim.loop.Trainer` runs any of them.
"""

from __future__ import annotations

import inspect
from typing import Any

from torch import nn

from dpfl.data.dataset import FederatedDataset
from dpfl.errors import DpflError
from dpfl.sim.algorithms.dp_fedavg import DpFedAvg
from dpfl.sim.algorithms.dsgd_rp import DsgdRandomParticipation
from dpfl.sim.algorithms.locks import Locks
from dpfl.sim.algorithms.ms_pafl import MsPafl
from dpfl.sim.algorithms.prifedsync import PriFedSync
from dpfl.sim.loop import Algorithm

__all__ = [
    "ALGORITHMS",
    "DpFedAvg",
    "DsgdRandomParticipation",
    "Locks",
    "MsPafl",
    "PriFedSync",
    "algorithm_parameters",
    "build_algorithm",
]

#: Registered algorithms, by name.
ALGORITHMS: dict[str, type] = {
    DsgdRandomParticipation.name: DsgdRandomParticipation,
    DpFedAvg.name: DpFedAvg,
    MsPafl.name: MsPafl,
    Locks.name: Locks,
    PriFedSync.name: PriFedSync,
}

_COMMON = ("model", "dataset", "device")


def _key(name: str) -> str:
    return str(name).strip().lower().replace("_", "-")


def algorithm_parameters(name: str) -> dict[str, Any]:
    """The parameters an algorithm takes, with their defaults.

    A required parameter has the default ``inspect.Parameter.empty``.

    Parameters
    ----------
    name : str
        A key of :data:`ALGORITHMS` (case and ``_``/``-`` ignored).

    Returns
    -------
    dict of str to object
        Parameter name to default, without ``model``, ``dataset`` and ``device``.

    Raises
    ------
    dpfl.errors.DpflError
        If the name is unknown.
    """
    cls = _lookup(name)
    sig = inspect.signature(cls)  # the constructor's parameters, without self
    return {p.name: p.default for p in sig.parameters.values() if p.name not in _COMMON}


def _lookup(name: str) -> type:
    cls = ALGORITHMS.get(_key(name))
    if cls is None:
        raise DpflError(
            f"unknown algorithm {name!r}; available: {', '.join(sorted(ALGORITHMS))}"
        )
    return cls


def build_algorithm(
    name: str,
    *,
    model: nn.Module,
    dataset: FederatedDataset,
    device: str = "cpu",
    **params: Any,
) -> Algorithm:
    """Build a registered algorithm.

    Parameters
    ----------
    name : str
        ``"dsgd-rp"`` (DP-DSGD with random participation); case and ``_`` are
        ignored.
    model : torch.nn.Module
        The model to train.
    dataset : FederatedDataset
        The federated data.
    device : str
        Torch device.
    **params
        The algorithm's own parameters (see :func:`algorithm_parameters`).

    Returns
    -------
    Algorithm
        The algorithm, ready for a :class:`~dpfl.sim.loop.Trainer`.

    Raises
    ------
    dpfl.errors.DpflError
        If the name is unknown, a parameter is unknown or a required one is
        missing (the message names it and lists the accepted ones);
        :class:`~dpfl.errors.InvalidParameterError` for a bad value.
    """
    cls = _lookup(name)
    accepted = algorithm_parameters(name)
    unknown = sorted(set(params) - set(accepted))
    if unknown:
        raise DpflError(
            f"algorithm {_key(name)!r} does not take parameter(s) {unknown}; "
            f"it takes {sorted(accepted)}"
        )
    missing = sorted(
        k
        for k, v in accepted.items()
        if v is inspect.Parameter.empty and k not in params
    )
    if missing:
        raise DpflError(f"algorithm {_key(name)!r} needs parameter(s) {missing}")
    algorithm: Algorithm = cls(model=model, dataset=dataset, device=device, **params)
    return algorithm
