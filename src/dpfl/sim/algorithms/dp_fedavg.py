"""Client-level DP-FedAvg (Geyer, Klein & Nabi 2017, Algorithm 1; docs/analyses.md).

One round ``t``, as in the paper's pseudo-code::

    (guard)  the ledger refuses the round if δ(ε) after it would exceed Q
    Z_t   <- m_t of the K clients, uniformly without replacement   (server)
    for k in Z_t:  w <- w_t; E epochs of mini-batch SGD (B, η)     (client k)
                   Δw_k = w - w_t;  ζ_k = ‖Δw_k‖₂
                   send Δw_k / max(1, ζ_k/S) and ζ_k
    S     <- clipping bound (fixed, median{ζ_k}, or adaptive quantile)
    w_{t+1} = w_t + (1/m_t) [ Σ_k Δw_k / max(1, ζ_k/S) + N(0, σ_Δ² S² I) ]

**Who draws what.** The server draws the cohort from its round generator
(:class:`~dpfl.sim.sampling.FixedCohortSampler` or
:class:`~dpfl.sim.sampling.PoissonClientSampler`, whose event the ledger
prices) and the noise from its noise generator (the update's, then the
adaptive bound's count). Client ``k`` draws its visiting order of its records,
epoch by epoch, from its *own* generator (:func:`dpfl.sim.local.epoch_orders`),
so the one-client-at-a-time step (:func:`dpfl.sim.local.client_local_sgd`)
and the batched cohort (:func:`dpfl.sim.local.cohort_local_sgd`: the clients'
models stacked, every local step one
:func:`~dpfl.sim.local.cohort_sgd_step` over padded, masked batches) train on
the same batches and agree to float rounding.

**Stopping at Q.** Algorithm 1 asks the moments accountant for δ at a fixed ε
before each round and stops when δ > Q. dpfl does this with the ledger's
budget guard: ``Budget(epsilon=ε, delta=Q)`` refuses the round whose release
would give ``ε(Q) > ε``, the same condition as ``δ(ε) > Q``. Which accountant
prices the rounds is the ledger's choice: ``PrivacyLedger(budget,
analysis="sound")`` (fixed cohort, replace-one, exact PLD: valid for
Algorithm 1 as written), ``analysis="paper-pld"`` (the cohort read as
Poisson(m/K), tight PLD), or a ledger with
:class:`~dpfl.accounting.guards.MomentsAccountantGuard` (the paper's own
rule: moments accountant with the Poisson reading; looser, stops earlier).

**Clipping bounds** (``clipping``):

``"fixed"``
    A constant S = ``clip``; the client clips. The round is the Gaussian
    mechanism of noise multiplier σ on a sum of sensitivity S.
``"median"``
    The paper's S = median{ζ_k} over the cohort. The bound is known only once
    every norm is in, so clients send their unclipped updates and the server
    clips. **Not private on its own**: S is released (it scales the noise)
    without noise of its own, and its leakage is *not* charged; the event
    prices only the noisy sum, every round's metrics carry
    ``clip_bound_private = 0``, and :meth:`DpFedAvg.unproven_reason` says so.
``"adaptive"``
    Andrew et al. (2021): the bound follows a target quantile γ of the update
    norms, ``C_{t+1} = C_t · exp(-η_C (b̃_t - γ))`` with
    ``b̃_t = (Σ_k (1[ζ_k <= C_t] - 1/2) + N(0, σ_b²)) / m_t + 1/2``. The server
    sends C_t with the task; the client clips to it.

**How the one σ is split (adaptive clipping).** σ is the run's one noise
multiplier (``privacy.noise_multiplier``) and the event is always
``FixedCohort(m_t, K, Gaussian(σ))`` (or ``ClientPoisson``). With adaptive
clipping a round releases two Gaussian queries, the update sum (sensitivity
C_t, noise σ_Δ C_t) and the centred count (sensitivity 1/2, noise σ_b); as
in Andrew et al. (Thm. 1) they are jointly one Gaussian mechanism of
multiplier ``(σ_Δ⁻² + (2σ_b)⁻²)^(-1/2)`` (both sensitivities double under
replace-one, so the same holds there). The update noise is therefore

    σ_Δ = (σ⁻² − (2σ_b)⁻²)^(-1/2)

so that the joint release is exactly the Gaussian of multiplier σ that the
event charges. σ_b is ``count_noise_multiplier`` (default ``m_t/20``, the
paper's recommendation) and stays fixed as σ changes: raising σ raises σ_Δ
(σ_Δ > σ always, σ_Δ → σ as σ_b → ∞), and σ must stay below ``2σ_b``
(otherwise no σ_Δ exists and the round is refused with an error). C_t itself
is post-processing of earlier releases.

**Schedules.** ``cohort_size`` takes a constant, a list (one value per round;
the last is held afterwards) or a linear ramp ``{"start": a, "stop": b,
"rounds": n}`` (value ``a`` at round 0, ``b`` from round ``n - 1`` on; rounded
to integers); :meth:`DpFedAvg.round_event` takes the round index. σ is one
number.

**Poisson clients.** ``sampling="poisson"`` lets each client join w.p.
``m_t/K`` and divides by the *expected* cohort m_t; the event is
``ClientPoisson(m_t/K, Gaussian(σ))``, for which the Poisson reading is valid.

**Diagnostics** (computed when the algorithm's ``diagnostics`` is set: on
the rounds a :class:`~dpfl.sim.loop.Trainer` evaluates, or every round when
it is built with ``diagnostics=True``; Geyer §3, on the cohort's *unclipped*
updates, averaged over
all P model parameters — the paper's q×p for one weight matrix): between-client
variance ``V_c = (1/P) Σ_j (1/m) Σ_k (Δw^k_j − μ_j)²`` and update scale
``U_s = (1/P) Σ_j μ_j²`` with ``μ = (1/m) Σ_k Δw^k``; communication cost
``CC = Σ_t m_t`` (realised cohorts). A clipped update is scaled back by its
factor ``max(1, ζ_k/S)`` (the client sends ζ_k) to form them.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any, cast

import numpy as np
import torch

from dpfl.accounting.events import Event
from dpfl.errors import InvalidParameterError
from dpfl.sim.algorithms.base import (
    AlgorithmParams,
    DataStats,
    FederatedAlgorithm,
    Messages,
)
from dpfl.sim.algorithms.dp_fedavg_params import DpFedAvgParams
from dpfl.sim.algorithms.registry import register
from dpfl.sim.algorithms.tasks import Cohort, Message, Task
from dpfl.sim.noise import noisy_count
from dpfl.sim.objectives import make_objective
from dpfl.sim.privatize import CentralGaussian
from dpfl.sim.randomness import Streams
from dpfl.sim.sampling import FixedCohortSampler, PoissonClientSampler

__all__ = [
    "Aggregate",
    "DpFedAvg",
    "between_client_variance",
    "update_scale",
]


MEDIAN_UNPROVEN = (
    "median clipping releases the clipping bound S (the median of the "
    "cohort's update norms) without noise, and that leak is not "
    "charged: the reported epsilon covers the noisy sum only, so it is "
    "not a valid bound for the run (Geyer et al. 2017, Section 3); use "
    "clipping 'fixed' or 'adaptive'"
)


# --------------------------------------------------------------- diagnostics
def between_client_variance(updates: torch.Tensor | np.ndarray) -> float:
    """Geyer et al.'s between-client variance V_c of a cohort's updates.

    Parameters
    ----------
    updates : torch.Tensor or numpy.ndarray
        ``[m, P]``: client ``k``'s flattened update Δw_k in row ``k``.

    Returns
    -------
    float
        ``V_c = (1/P) Σ_j (1/m) Σ_k (Δw^k_j − μ_j)²`` with ``μ_j`` the cohort
        mean of parameter ``j`` (population variance, as in the paper).

    Raises
    ------
    dpfl.errors.InvalidParameterError
        If ``updates`` is not a non-empty 2-D array.

    References
    ----------
    Geyer, Klein & Nabi (2017), §3, definition of V_c.
    """
    return _cohort_moments(_as_update_matrix(updates))[0]


def update_scale(updates: torch.Tensor | np.ndarray) -> float:
    """Geyer et al.'s update scale U_s of a cohort's updates.

    Parameters
    ----------
    updates : torch.Tensor or numpy.ndarray
        ``[m, P]`` flattened updates, one row per client.

    Returns
    -------
    float
        ``U_s = (1/P) Σ_j μ_j²`` with ``μ_j`` the cohort mean of parameter ``j``.

    Raises
    ------
    dpfl.errors.InvalidParameterError
        If ``updates`` is not a non-empty 2-D array.

    References
    ----------
    Geyer, Klein & Nabi (2017), §3, definition of U_s.
    """
    return _cohort_moments(_as_update_matrix(updates))[1]


def _cohort_moments(
    rows: torch.Tensor,
    scale: torch.Tensor | None = None,
    norms: torch.Tensor | None = None,
) -> tuple[float, float]:
    """``(V_c, U_s)`` of the updates ``scale[k] * rows[k]``, in ``rows``' dtype.

    The cohort mean ``μ`` is one matrix-vector product. With ``norms`` (the
    updates' norms, as the clients computed them), ``V_c`` is the mean square
    ``Σ_k norms_k² / (m P)`` less ``U_s``, taken only when that difference
    keeps at least a tenth of the mean square: the float32 mean's relative
    error (about ``m`` ulps at worst) then reaches ``V_c`` at most tenfold,
    ``6e-5`` relative at worst. Otherwise (the updates nearly agree), and
    without ``norms``, ``V_c`` is the mean squared distance to ``μ``, the
    deviations formed (no cancellation: relative error about ``1e-7
    sqrt(U_s / V_c)`` in float32); :func:`between_client_variance` and
    :func:`update_scale` pass float64.

    Parameters
    ----------
    rows : torch.Tensor
        ``[m, P]``, ``m >= 1``.
    scale : torch.Tensor, optional
        ``[m]`` factors (a clipped update times ``1 / factor`` is the
        unclipped one); ``None`` for 1.
    norms : torch.Tensor, optional
        ``[m]`` norms of the scaled rows.

    Returns
    -------
    (float, float)
        ``V_c`` and ``U_s`` (Geyer et al. 2017, §3).
    """
    m, p = rows.shape
    w = (
        torch.ones(m, dtype=rows.dtype, device=rows.device)
        if scale is None
        else scale.to(dtype=rows.dtype, device=rows.device)
    )
    mu = torch.mv(rows.T, w) / m
    mu64 = mu.to(torch.float64)
    us = float(mu64.dot(mu64)) / p
    if norms is not None:
        second = float(norms.to(torch.float64).square().sum()) / (m * p)
        if second - us > 0.1 * second:
            return second - us, us
    dev = torch.addcmul(-mu, rows, w[:, None])  # scale[k] row_k - mu
    squares = torch.linalg.vector_norm(dev, dim=1).to(torch.float64).square()
    return float(squares.sum()) / (m * p), us


def _as_update_matrix(updates: torch.Tensor | np.ndarray) -> torch.Tensor:
    u = torch.as_tensor(updates, dtype=torch.float64)
    if u.dim() != 2 or u.shape[0] == 0 or u.shape[1] == 0:
        raise InvalidParameterError(
            f"updates must be a non-empty [clients, parameters] matrix; got shape "
            f"{tuple(u.shape)}"
        )
    return u


# --------------------------------------------------------------- the algorithm
@dataclasses.dataclass
class Aggregate:
    """What :meth:`DpFedAvg.aggregate` hands the privatize step.

    Attributes
    ----------
    total : torch.Tensor
        ``[d]``: the sum of the clipped updates.
    bound : float
        The round's clipping bound S.
    norms : torch.Tensor
        ``[m]`` float64: the updates' norms ζ_k (before clipping).
    participants : int
        Updates received.
    metrics : dict of str to float
        The diagnostics (Geyer et al. §3), when any update arrived.
    """

    total: torch.Tensor
    bound: float
    norms: torch.Tensor
    participants: int
    metrics: dict[str, float]


@register
class DpFedAvg(FederatedAlgorithm):
    """Client-level DP-FedAvg (name ``"dp-fedavg"``).

    See :class:`~dpfl.sim.algorithms.base.FederatedAlgorithm` for the
    arguments; the parameters are :class:`DpFedAvgParams`. No BatchNorm.

    Attributes
    ----------
    clip_bound : float
        Current clipping bound C_t (adaptive) or the fixed one.
    communication_cost : int
        ``Σ_t m_t`` over the rounds run so far (realised cohorts).

    References
    ----------
    Geyer, Klein & Nabi, "Differentially private federated learning: a client
    level perspective", 2017, Algorithm 1 and §3. McMahan, Ramage, Talwar &
    Zhang, "Learning differentially private recurrent language models", ICLR
    2018 (DP-FedAvg). Andrew, Thakkar, McMahan & Ramaswamy, "Differentially
    private learning with adaptive clipping", NeurIPS 2021, Algorithm 1 and
    Theorem 1.
    """

    name = "dp-fedavg"
    Params = DpFedAvgParams
    params: DpFedAvgParams
    per_client_accounting = False

    # -- accounting (pure) ------------------------------------------------------------
    @staticmethod
    def sampler(
        params: DpFedAvgParams, stats: DataStats, round_index: int = 0
    ) -> FixedCohortSampler | PoissonClientSampler:
        """The round's client sampler: m_t of K uniformly, or each w.p. m_t/K."""
        m = params.cohort_at(round_index, stats.num_clients)
        if params.sampling == "poisson":
            return PoissonClientSampler(
                num_clients=stats.num_clients,
                participation_probability=m / stats.num_clients,
                client_sizes=stats.sizes,
            )
        return FixedCohortSampler(
            num_clients=stats.num_clients, cohort_size=m, client_sizes=stats.sizes
        )

    @classmethod
    def round_event(
        cls,
        params: AlgorithmParams,
        stats: DataStats,
        noise_multiplier: float,
        round_index: int = 0,
    ) -> Event:
        """``FixedCohort(m_t, K, Gaussian(σ))``, or ``ClientPoisson(m_t/K, ...)``.

        With adaptive clipping σ is the *joint* multiplier of the update sum
        and the count (module docstring); the round is refused if no update
        noise σ_Δ gives it.
        """
        p = cast(DpFedAvgParams, params)
        sampler = cls.sampler(p, stats, round_index)
        p.update_noise_multiplier(noise_multiplier, p.cohort_at(round_index))
        return sampler.event(noise_multiplier)

    @classmethod
    def unproven_reason(cls, params: AlgorithmParams) -> str | None:
        """Median clipping releases its bound without noise (not charged)."""
        return (
            MEDIAN_UNPROVEN
            if cast(DpFedAvgParams, params).clipping == "median"
            else None
        )

    def setup(self) -> None:
        """Validate round 0 against the data and σ; start C_0 and CC = 0."""
        if self.private:
            type(self).round_event(self.params, self.stats, self.noise_multiplier, 0)
        else:
            self.params.cohort_at(0, self.stats.num_clients)
        self.clip_bound = float(self.params.clip)
        self.communication_cost = 0
        self.objective = make_objective(self.params.local_objective)
        # by cohort size m_t: a round builds no sampler (O(K) checks) or event
        self._samplers: dict[int, FixedCohortSampler | PoissonClientSampler] = {}
        self._events: dict[int, Event] = {}

    def event(self, round_index: int = 0) -> Event | None:
        """The event of round ``round_index`` (made once per cohort size m_t)."""
        if not self.private:
            return None
        m = self.params.cohort_at(round_index, self.stats.num_clients)
        found = self._events.get(m)
        if found is None:
            found = super().event(round_index)
            assert found is not None
            self._events[m] = found
        return found

    def _round_sampler(
        self, round_index: int
    ) -> FixedCohortSampler | PoissonClientSampler:
        """:meth:`sampler` of round ``round_index``, made once per cohort size."""
        m = self.params.cohort_at(round_index, self.stats.num_clients)
        found = self._samplers.get(m)
        if found is None:
            found = self._samplers[m] = self.sampler(
                self.params, self.stats, round_index
            )
        return found

    # -- Algorithm 1, one round -----------------------------------------------------
    def select(self, round_index: int, server: Streams) -> Cohort:
        """Z_t ← m_t of K clients (or each w.p. m_t/K); send w_t and, if known, S."""
        p = self.params
        m = p.cohort_at(round_index, self.stats.num_clients)
        sample = self._round_sampler(round_index).sample(server.rng)
        # The client clips when the bound is known before the round.
        options = {} if p.clipping == "median" else {"clip": self.clip_bound}
        tasks = [Task(int(k), options=options) for k in sample.clients]
        return Cohort(
            sample.clients,
            tasks,
            {"cohort_size": m, "clip_bound": self.clip_bound, "round": round_index},
        )

    def _clipped(self, update: torch.Tensor, task: Task) -> Message:
        """Clip ``update`` (``[d]``) to the task's bound, if any; send ζ = ‖Δw‖."""
        norm = float(torch.linalg.vector_norm(update))
        clip = task.options.get("clip")
        if clip is not None and norm > clip:
            update = update * (clip / norm)
        return Message(update, {"norm": norm})

    def client_step(
        self, weights: torch.Tensor, task: Task, streams: Streams
    ) -> Message:
        """E epochs of SGD from w_t on the client's data; send clip_S(Δw_k) and ζ_k."""
        update, _ = self.local_sgd_update(weights, task, streams, **self._local())
        return self._clipped(update, task)

    def _local(self) -> dict[str, Any]:
        p = self.params
        return {
            "epochs": p.local_epochs,
            "batch_size": p.batch_size,
            "learning_rate": p.learning_rate,
            "objective": self.objective,
        }

    def client_steps(
        self, weights: torch.Tensor, tasks: Sequence[Task], streams: Sequence[Streams]
    ) -> Messages:
        """The cohort's local training as one batched computation (same messages)."""
        if not tasks:
            return Messages.stack([], weights)
        updates, _ = self.local_sgd_updates(weights, tasks, streams, **self._local())
        norms = torch.linalg.vector_norm(updates, dim=1).double()
        clips = [t.options.get("clip") for t in tasks]
        if all(c is not None for c in clips):
            if len(set(clips)) == 1:  # one bound (the usual case): no tensor of it
                factor = (clips[0] / norms).clamp_(max=1.0)
            else:
                bound = torch.tensor(clips, dtype=torch.float64, device=norms.device)
                factor = torch.where(norms > bound, bound / norms, 1.0)
            updates.mul_(factor.to(updates.dtype)[:, None])  # ours: scale in place
        return Messages(updates, {"norm": norms})

    # -- the server step: aggregate -> privatize -> server optimiser -> apply -------
    def server_step(
        self, cohort: Cohort, messages: Messages, server: Streams
    ) -> dict[str, float]:
        """S; Σ clipped + N(0, σ_Δ²S²); / m_t; adaptive C_{t+1}; the server's step.

        The seams, in order: :meth:`aggregate` (the clipped sum and the
        diagnostics), :meth:`privatize` (the round's noise: update sum, then
        the adaptive count), the server optimiser and the step
        (:meth:`~dpfl.sim.algorithms.base.FederatedAlgorithm.server_update`,
        post-processing of the noisy average).
        """
        p = self.params
        m_t = int(cohort.info["cohort_size"])
        c_t = float(cohort.info["clip_bound"])
        agg = self.aggregate(messages, c_t)
        total, fraction, noise_std = self.privatize(agg, m_t, c_t, server)
        metrics = agg.metrics
        next_bound = c_t
        if fraction is not None:
            next_bound = c_t * math.exp(
                -p.clip_learning_rate * (fraction - p.target_quantile)
            )
            metrics["noisy_fraction_under"] = fraction
            metrics["clip_bound_next"] = next_bound

        average = total / m_t
        self.server_update(average, learning_rate=p.server_learning_rate)
        self.clip_bound = next_bound
        self.communication_cost += agg.participants
        metrics.update(
            participants=float(agg.participants),
            cohort_size=float(m_t),
            noise_multiplier=float(self.noise_multiplier),
            clip_bound=agg.bound,
            clip_bound_private=0.0 if p.clipping == "median" else 1.0,
            clipped_fraction=(
                float((agg.norms > agg.bound).double().mean())
                if agg.participants
                else 0.0
            ),
            communication_cost=float(self.communication_cost),
            noise_std=noise_std,
            update_norm=float(average.norm()),
        )
        return metrics

    def aggregate(self, messages: Messages, clip_bound: float) -> Aggregate:
        """The bound S, the sum of the clipped updates and Geyer's diagnostics.

        S is ``clip_bound`` (fixed or adaptive: the clients clipped to it) or
        the cohort's median norm (the server clips).
        """
        p = self.params
        vectors = messages.vectors
        m_real = int(vectors.shape[0])
        norms = (
            messages.scalars["norm"].to(torch.float64)
            if m_real
            else torch.zeros(0, dtype=torch.float64, device=vectors.device)
        )
        metrics: dict[str, float] = {}
        # Clipping bound S, and each update's clip factor min(1, S/ζ_k).
        if p.clipping == "median" and m_real:
            bound = float(torch.quantile(norms, 0.5))
        else:
            bound = clip_bound
        if bound > 0:
            factor = (bound / norms).clamp(max=1.0)
        else:  # median of all-zero updates: nothing to send
            factor = torch.zeros_like(norms)
        factor_v = factor.to(device=vectors.device, dtype=vectors.dtype)[:, None]
        clipped = vectors * factor_v if p.clipping == "median" else vectors
        if m_real and self.diagnostics:
            # clipped by the clients (fixed, adaptive): scale back
            back = 1.0 / factor if p.clipping != "median" and bound > 0 else None
            vc, us = _cohort_moments(vectors, back, norms)
            metrics["between_client_variance"] = vc
            metrics["update_scale"] = us
            metrics["update_norm_median"] = float(torch.quantile(norms, 0.5))
        total = clipped.sum(0) if m_real else torch.zeros_like(self.weights)
        return Aggregate(total, bound, norms, m_real, metrics)

    def privatize(
        self, agg: Aggregate, cohort_size: int, clip_bound: float, server: Streams
    ) -> tuple[torch.Tensor, float | None, float]:
        """The round's releases: the noisy sum, then the adaptive bound's noisy count.

        Returns
        -------
        tuple
            ``(Σ clipped + N(0, σ_Δ² S²), b̃_t or None, σ_Δ S)``: the noisy sum,
            the noisy fraction of norms under C_t (adaptive clipping only) and
            the std of the sum's noise (0 when not private).
        """
        p = self.params
        total, noise_std = agg.total, 0.0
        if self.private and agg.bound > 0:
            sigma_update = p.update_noise_multiplier(self.noise_multiplier, cohort_size)
            privatizer = CentralGaussian(noise_multiplier=sigma_update, clip=agg.bound)
            total = privatizer.add_noise(
                {"update": total},
                num_participants=agg.participants,
                num_available=self.stats.num_clients,
                generator=server.generator,
            )["update"]
            noise_std = sigma_update * agg.bound
        if p.clipping != "adaptive":
            return total, None, noise_std
        count = float((agg.norms <= clip_bound).double().sum()) - 0.5 * agg.participants
        if self.private:
            count = noisy_count(count, p.count_noise(cohort_size), server.generator)
        return total, count / cohort_size + 0.5, noise_std

    # -- state ----------------------------------------------------------------------
    def extra_state(self) -> dict[str, Any]:
        """The adaptive clip bound C_t and the communication cost so far."""
        return {
            "clip_bound": float(self.clip_bound),
            "communication_cost": int(self.communication_cost),
        }

    def load_extra_state(self, state: dict[str, Any]) -> None:
        """Restore :meth:`extra_state`."""
        self.clip_bound = float(state["clip_bound"])
        self.communication_cost = int(state["communication_cost"])
