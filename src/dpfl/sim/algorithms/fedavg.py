"""Federated averaging without privacy (McMahan et al., 2017, Algorithm 1).

The non-private baseline the private algorithms are measured against::

    S_t  <- m of the K clients, uniformly without replacement
    for k in S_t:  w_k <- E epochs of mini-batch SGD from w_t on k's data
                   (batch B, step η; a local objective may add a regulariser)
    w_{t+1} <- w_t + η_s · Σ_k (n_k / n_S) (w_k − w_t)

``weighting: uniform`` averages the updates with equal weights instead of
the clients' record counts. There is no noise and no guarantee: the run's
``privacy.noise_multiplier`` must be 0, and nothing is charged.

References
----------
McMahan, Moore, Ramage, Hampson & Agüera y Arcas, "Communication-efficient
learning of deep networks from decentralized data", AISTATS 2017, Alg. 1.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import torch

from dpfl._validate import check_count, check_positive
from dpfl.accounting.events import Event
from dpfl.errors import InvalidParameterError
from dpfl.sim.algorithms.base import (
    AlgorithmParams,
    DataStats,
    FederatedAlgorithm,
    Messages,
)
from dpfl.sim.algorithms.registry import register
from dpfl.sim.algorithms.tasks import Cohort, Message, Task
from dpfl.sim.objectives import make_objective
from dpfl.sim.randomness import Streams
from dpfl.sim.sampling import FixedCohortSampler
from dpfl.sim.server_opt import check_server_optimizer

__all__ = ["FedAvg", "FedAvgParams"]


@dataclasses.dataclass(frozen=True)
class FedAvgParams(AlgorithmParams):
    """Parameters of federated averaging.

    Attributes
    ----------
    cohort_size : int
        m: clients per round, drawn uniformly without replacement.
    local_epochs : int
        E: passes over a client's data per round.
    batch_size : int
        B: records per local step.
    local_learning_rate : float
        η: the local SGD step.
    server_learning_rate : float
        η_s: the step along the averaged update (1: plain averaging).
    weighting : {"records", "uniform"}
        Average updates by the clients' record counts (McMahan et al.) or
        with equal weights.
    local_objective : dict
        What clients minimise: ``{"name": "erm"}`` (default) or a registered
        objective with its options (:mod:`dpfl.sim.objectives`), e.g.
        ``{"name": "proximal", "mu": 0.01}`` (FedProx).
    server_optimizer : dict
        The server's step from the average: ``{"name": "sgd"}`` (default),
        ``momentum`` (FedAvgM), ``adam`` (FedAdam), ``yogi`` or ``adagrad``
        with their options, η_s as the step size (:mod:`dpfl.sim.server_opt`).
    """

    cohort_size: int = 10
    local_epochs: int = 1
    batch_size: int = 10
    local_learning_rate: float = 0.1
    server_learning_rate: float = 1.0
    weighting: str = "records"
    local_objective: dict[str, Any] = dataclasses.field(
        default_factory=lambda: {"name": "erm"}
    )
    server_optimizer: dict[str, Any] = dataclasses.field(
        default_factory=lambda: {"name": "sgd"}
    )

    def __post_init__(self) -> None:
        self._set("server_optimizer", check_server_optimizer(self.server_optimizer))
        self._set(
            "cohort_size", check_count("cohort_size", self.cohort_size, minimum=1)
        )
        self._set(
            "local_epochs", check_count("local_epochs", self.local_epochs, minimum=1)
        )
        self._set("batch_size", check_count("batch_size", self.batch_size, minimum=1))
        self._set(
            "local_learning_rate",
            check_positive("local_learning_rate", self.local_learning_rate),
        )
        self._set(
            "server_learning_rate",
            check_positive("server_learning_rate", self.server_learning_rate),
        )
        if self.weighting not in ("records", "uniform"):
            raise InvalidParameterError(
                f"weighting must be 'records' or 'uniform'; got {self.weighting!r}"
            )
        make_objective(self.local_objective)  # validates the name and options


@register
class FedAvg(FederatedAlgorithm):
    """Non-private federated averaging (``"fedavg"``); see :class:`FedAvgParams`."""

    name = "fedavg"
    Params = FedAvgParams
    params: FedAvgParams

    @classmethod
    def round_event(
        cls,
        params: AlgorithmParams,
        stats: DataStats,
        noise_multiplier: float,
        round_index: int = 0,
    ) -> Event:
        """FedAvg adds no noise, so it has no event to price."""
        raise InvalidParameterError(
            "fedavg adds no noise and has no privacy guarantee: set "
            "privacy.noise_multiplier to 0 (use dp-fedavg for a private run)"
        )

    def setup(self) -> None:
        """The cohort sampler and the local objective."""
        if self.private:
            self.round_event(self.params, self.stats, self.noise_multiplier)
        p = self.params
        if p.cohort_size > self.stats.num_clients:
            raise InvalidParameterError(
                f"cohort_size must be <= the {self.stats.num_clients} clients; got "
                f"{p.cohort_size}"
            )
        self.sampler = FixedCohortSampler(
            num_clients=self.stats.num_clients,
            cohort_size=p.cohort_size,
            client_sizes=self.stats.sizes,
        )
        self.objective = make_objective(p.local_objective)

    def select(self, round_index: int, server: Streams) -> Cohort:
        """S_t ← m clients uniformly without replacement."""
        clients = self.sampler.sample(server.rng).clients
        return Cohort(clients, [Task(int(k)) for k in clients])

    def client_step(
        self, weights: torch.Tensor, task: Task, streams: Streams
    ) -> Message:
        """w_k ← E epochs of SGD from w_t; send w_k − w_t and n_k."""
        update, n = self.local_sgd_update(weights, task, streams, **self._local())
        return Message(update, {"records": float(n)})

    def client_steps(
        self, weights: torch.Tensor, tasks: Sequence[Task], streams: Sequence[Streams]
    ) -> Messages:
        """The cohort's local training as one batched computation (same messages)."""
        if not tasks:
            return Messages.stack([], weights)
        updates, counts = self.local_sgd_updates(
            weights, tasks, streams, **self._local()
        )
        records = torch.tensor(counts, dtype=torch.float64, device=updates.device)
        return Messages(updates, {"records": records})

    def _local(self) -> dict[str, Any]:
        p = self.params
        return {
            "epochs": p.local_epochs,
            "batch_size": p.batch_size,
            "learning_rate": p.local_learning_rate,
            "objective": self.objective,
        }

    def server_step(
        self, cohort: Cohort, messages: Messages, server: Streams
    ) -> dict[str, float]:
        """Server: Δ = Σ_k ω_k Δ_k, ω_k = n_k / n_S (or 1/m); w ← w + η_s · opt(Δ)."""
        vectors = messages.vectors
        if self.params.weighting == "records":
            weights = messages.scalars["records"]
            weights = weights / weights.sum()
        else:
            weights = torch.full(
                (len(cohort.tasks),),
                1.0 / len(cohort.tasks),
                dtype=torch.float64,
                device=vectors.device,
            )
        average = (weights.to(vectors.dtype)[:, None] * vectors).sum(dim=0)
        self.server_update(average, learning_rate=self.params.server_learning_rate)
        return {
            "participants": float(len(cohort.participants)),
            "update_norm": float(torch.linalg.vector_norm(average)),
        }
