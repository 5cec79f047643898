"""FedProx's proximal objective: ``F_k(θ) + (μ/2)‖θ − θ_global‖²``.

Each local step adds ``μ (θ − θ_global)`` to the data gradient, pulling the
client's model towards the global model the round started from; with
heterogeneous clients (non-iid data, unequal local work) this keeps local
models from drifting apart (Li et al., "Federated optimization in
heterogeneous networks", MLSys 2020, eq. (2)). The federated f-DP analysis
of PriFedSync lists this proximal term among the local objectives it covers
(Zheng et al., "Federated f-differential privacy", AISTATS 2021). The term
reads no record, so the privacy guarantee of the algorithm it is used in is
unchanged.

Choose it with ``algorithm.params.local_objective: {name: proximal, mu: 0.01}``.
"""

from __future__ import annotations

import dataclasses

import torch

from dpfl._validate import check_nonnegative
from dpfl.sim.objectives import LocalObjective, register_objective

__all__ = ["Proximal"]


@register_objective
@dataclasses.dataclass(frozen=True)
class Proximal(LocalObjective):
    """``R(θ) = (μ/2)‖θ − θ_global‖²``; ``μ = 0`` is plain ERM.

    Attributes
    ----------
    mu : float
        The proximal weight μ >= 0.
    """

    name = "proximal"
    mu: float = 0.01

    def __post_init__(self) -> None:
        object.__setattr__(self, "mu", check_nonnegative("mu", self.mu))

    def gradient(
        self, theta: torch.Tensor, anchor: torch.Tensor
    ) -> torch.Tensor | None:
        """``μ (θ − θ_global)``."""
        if self.mu == 0.0:
            return None
        return (theta - anchor).mul_(self.mu)
