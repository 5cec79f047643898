"""Local objectives: what a client minimises in its local training.

A client's local training minimises ``F_k(θ) + R(θ; θ_global)``: its
empirical risk ``F_k`` plus an optional regulariser ``R`` that may depend on
the global model the round started from. An objective adds ``∇R`` to each
local step's data gradient. ``∇R`` depends on no record, so it leaves every
privacy guarantee unchanged: update-level clipping (DP-FedAvg) bounds the
whole update, and record-level clipping (DP-SGD local steps) bounds only the
data term, which is the one that carries records.

``erm``
    Plain empirical risk (``R = 0``), the default.

Further objectives register here by type (:func:`register_objective`), one
module each, imported in the block below, and are chosen in a run
configuration by ``algorithm.params.local_objective: {name: ..., ...}``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, ClassVar, TypeVar

import torch

from dpfl.errors import InvalidParameterError

__all__ = [
    "OBJECTIVES",
    "Erm",
    "LocalObjective",
    "make_objective",
    "register_objective",
]


@dataclasses.dataclass(frozen=True)
class LocalObjective:
    """Base of the local objectives: the regulariser's gradient, over clients."""

    name: ClassVar[str]

    def gradient(
        self, theta: torch.Tensor, anchor: torch.Tensor
    ) -> torch.Tensor | None:
        """``∇R`` at the clients' parameters.

        Parameters
        ----------
        theta : torch.Tensor
            Flat client parameters ``[..., d]`` (a row per client, or one).
        anchor : torch.Tensor
            The global parameters the round started from, ``[d]``.

        Returns
        -------
        torch.Tensor or None
            ``[..., d]``, or ``None`` when ``R = 0``.
        """
        return None


#: Registered objectives, by name.
OBJECTIVES: dict[str, type[LocalObjective]] = {}

_O = TypeVar("_O", bound=type[LocalObjective])


def register_objective(cls: _O) -> _O:
    """Class decorator: make an objective selectable by its ``name``."""
    if cls.name in OBJECTIVES and OBJECTIVES[cls.name] is not cls:
        raise InvalidParameterError(
            f"an objective named {cls.name!r} is already registered"
        )
    OBJECTIVES[cls.name] = cls
    return cls


@register_objective
@dataclasses.dataclass(frozen=True)
class Erm(LocalObjective):
    """Plain empirical risk minimisation: no regulariser."""

    name = "erm"


def make_objective(
    spec: str | Mapping[str, Any] | LocalObjective | None,
) -> LocalObjective:
    """An objective from its configuration ``{name: ..., **options}`` (or a name).

    Raises
    ------
    dpfl.errors.InvalidParameterError
        On an unknown name (the message lists the registered ones) or a bad
        option (the objective's own check names it).
    """
    if spec is None:
        return Erm()
    if isinstance(spec, LocalObjective):
        return spec
    options = {"name": spec} if isinstance(spec, str) else dict(spec)
    name = options.pop("name", "erm")
    cls = OBJECTIVES.get(str(name))
    if cls is None:
        raise InvalidParameterError(
            f"local_objective name must be one of {sorted(OBJECTIVES)}; got {name!r}"
        )
    fields = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(options) - fields)
    if unknown:
        raise InvalidParameterError(
            f"local_objective {name!r} does not take {unknown}; it takes "
            f"{sorted(fields) or 'no options'}"
        )
    return cls(**options)


from dpfl.sim.objectives import (  # noqa: E402, F401  (each import registers one objective)
    proximal,
)
