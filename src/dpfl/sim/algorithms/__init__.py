"""Federated algorithms by name: ``build_algorithm(name, params, model=, dataset=)``.

Each paper's system is one module here that reads like its pseudo-code over
the shared pieces (:mod:`dpfl.sim.algorithms.base`, :mod:`dpfl.sim.sampling`,
:mod:`dpfl.sim.grad`, :mod:`dpfl.sim.local`, :mod:`dpfl.sim.privatize`); the
:class:`~dpfl.sim.loop.Trainer` runs any of them. A module registers its
algorithm with :func:`~dpfl.sim.algorithms.registry.register`; importing it here
is the one registration line.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from torch import nn

from dpfl.data.dataset import FederatedDataset
from dpfl.errors import InvalidParameterError
from dpfl.sim.algorithms import (  # noqa: F401  (each import registers one algorithm)
    dp_fedavg,
    dp_fednova,
    dsgd_rp,
    fedavg,
    locks,
    ms_pafl,
    prifedsync,
)
from dpfl.sim.algorithms.base import AlgorithmParams, FederatedAlgorithm
from dpfl.sim.algorithms.registry import ALGORITHMS, algorithm_class

__all__ = [
    "ALGORITHMS",
    "AlgorithmParams",
    "FederatedAlgorithm",
    "algorithm_class",
    "build_algorithm",
    "make_params",
]


def make_params(
    name: str, params: Mapping[str, Any] | AlgorithmParams | None = None
) -> AlgorithmParams:
    """The validated parameters of algorithm ``name`` from keywords.

    Raises
    ------
    dpfl.errors.InvalidParameterError
        If the name or a keyword is unknown (the message lists the accepted
        ones), or a value is out of its domain.
    """
    cls = algorithm_class(name)
    if isinstance(params, AlgorithmParams):
        if not isinstance(params, cls.Params):
            raise InvalidParameterError(
                f"params must be {cls.Params.__qualname__} for {cls.name!r}; got "
                f"{type(params).__name__}"
            )
        return params
    kwargs = dict(params or {})
    fields = {f.name for f in dataclasses.fields(cls.Params)}
    unknown = sorted(set(kwargs) - fields)
    if unknown:
        raise InvalidParameterError(
            f"algorithm {cls.name!r} does not take parameter(s) {unknown}; it takes "
            f"{sorted(fields)}"
        )
    return cls.Params(**kwargs)


def build_algorithm(
    name: str,
    params: Mapping[str, Any] | AlgorithmParams | None = None,
    *,
    model: nn.Module,
    dataset: FederatedDataset,
    noise_multiplier: float = 0.0,
    **options: Any,
) -> FederatedAlgorithm:
    """Build a registered algorithm.

    Parameters
    ----------
    name : str
        A key of :data:`ALGORITHMS` (case and ``_``/``-`` ignored).
    params : mapping or AlgorithmParams, optional
        The algorithm's parameters (its ``Params`` or keywords of it).
    model : torch.nn.Module
        The model to train.
    dataset : FederatedDataset
        The federated data.
    noise_multiplier : float
        σ (0: non-private).
    **options
        ``device``, ``max_clients``, ``eval_batch_size``, ``loss_fn``.

    Returns
    -------
    FederatedAlgorithm
        Ready for a :class:`~dpfl.sim.loop.Trainer`.
    """
    cls = algorithm_class(name)
    return cls(
        make_params(name, params),
        model=model,
        dataset=dataset,
        noise_multiplier=noise_multiplier,
        **options,
    )
