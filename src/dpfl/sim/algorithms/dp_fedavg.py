"""Client-level DP-FedAvg (Geyer, Klein & Nabi 2017, Algorithm 1; docs/analyses.md).

One round ``t``, as in the paper's pseudo-code::

    (guard)  the ledger refuses the round if δ(ε) after it would exceed Q
    Z_t   <- m_t of the K clients, uniformly without replacement
    for k in Z_t (in parallel):  w <- w_t; E epochs of mini-batch SGD (B, η)
                                 Δw_k = w - w_t;  ζ_k = ‖Δw_k‖₂
    S     <- clipping bound (fixed, median{ζ_k}, or adaptive quantile)
    w_{t+1} = w_t + (1/m_t) [ Σ_k Δw_k / max(1, ζ_k/S) + N(0, σ_t² S² I) ]

**The whole cohort trains as one batched computation**: the clients' copies of
the model are stacked along a leading dimension and every local SGD step is
one call of :func:`dpfl.sim.local.cohort_sgd_step`. Clients with fewer
records are padded and masked (``sample_mask``): a client whose records are
used up for this epoch takes a zero step. ``execution="loop"`` runs the same
computation one client at a time (the benchmark's reference).

**Stopping at Q.** Algorithm 1 asks the moments accountant for δ at a fixed ε
before each round and stops when δ > Q. dpfl does this with the ledger's
budget guard: ``Budget(epsilon=ε, delta=Q)`` refuses the round whose release
would give ``ε(Q) > ε``, which is the same condition as ``δ(ε) > Q`` (δ(ε) is
decreasing in ε). Which accountant prices the rounds depends on the ledger:

* ``PrivacyLedger(budget, analysis="sound")`` — fixed-size cohort, replace-one
  client, exact PLD of C_{m/K}(G_{2/σ}) (valid for Algorithm 1 as written);
* ``PrivacyLedger(budget, analysis="paper")`` — the cohort read as Poisson(m/K)
  sampling, add/remove, **tight PLD** (= ``rdp.dp_fedavg_stop_round(...,
  analysis="pld")``);
* :class:`MomentsAccountantLedger` — the paper's own rule: moments accountant
  (RDP) with the Poisson reading (= ``rdp.dp_fedavg_stop_round(...,
  analysis="paper")``). The RDP bound is looser than the PLD, so this ledger
  stops earlier (K=100, m=50, σ=1.2, ε=8, Q=1e-3: round 15 vs 19). In a run
  config: ``privacy: {analysis: paper, guard: moments-accountant}``; the
  ledger file names its guard, so a resumed run keeps the rule.

**Clipping bounds** (``clipping``):

``"fixed"``
    A constant S = ``clip``. Private: the round is the Gaussian mechanism of
    noise multiplier σ_t on a sum of sensitivity S.
``"median"``
    The paper's S = median{ζ_k} over the cohort. **Not private on its own**:
    S is a data-dependent statistic that is released (it scales the noise)
    without noise of its own, and its leakage is *not* charged. The event
    prices only the noisy sum; every round's metrics carry
    ``clip_bound_private = 0`` and :attr:`DpFedAvg.unproven` says so.
``"adaptive"``
    Andrew et al. (2021): the bound follows a target quantile γ of the update
    norms, ``C_{t+1} = C_t · exp(-η_C (b̃_t - γ))`` with
    ``b̃_t = (Σ_k (1[ζ_k <= C_t] - 1/2) + N(0, σ_b²)) / m + 1/2`` a noisy
    fraction of clients under the bound. **How its noise is charged**: as
    Andrew et al. (Thm. 1) do, the round releases two Gaussian queries, the
    update sum (sensitivity C_t, noise σ_Δ C_t) and the centred count
    (sensitivity 1/2, noise σ_b); jointly they are one Gaussian mechanism of
    ``μ = sqrt(σ_Δ⁻² + (2σ_b)⁻²)`` (both sensitivities double under
    replace-one, so the same holds there). The update noise is therefore set to
    ``σ_Δ = (σ_t⁻² − (2σ_b)⁻²)^(-1/2)`` so that the joint release is exactly a
    Gaussian of multiplier σ_t, and the event stays
    ``FixedCohort(m_t, K, Gaussian(σ_t))``. Requires ``2σ_b > σ_t``; the
    default ``σ_b = m/20`` is the paper's recommendation. C_t itself is
    post-processing of earlier releases.

**Schedules.** ``cohort_size`` and ``noise_multiplier`` each take a constant,
a list (one value per round; the last is held afterwards) or a linear ramp
``{"start": a, "stop": b, "rounds": n}`` (value ``a`` at round 0, ``b`` from
round ``n - 1`` on; cohort sizes are rounded to integers).

**Poisson clients.** ``sampling="poisson"`` lets each client join w.p.
``m_t/K`` and divides by the *expected* cohort m_t (docs/analyses.md); the
event is ``ClientPoisson(m_t/K, Gaussian(σ_t))``, for which the Poisson
reading is valid.

**Diagnostics** (Geyer §3, computed on the cohort's *unclipped* updates,
averaged over all P model parameters — the paper's q×p for one weight
matrix): between-client variance ``V_c = (1/P) Σ_j (1/m) Σ_k (Δw^k_j −
μ_j)²`` and update scale ``U_s = (1/P) Σ_j μ_j²`` with ``μ = (1/m) Σ_k Δw^k``;
communication cost ``CC = Σ_t m_t`` (realised cohort sizes).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from dpfl._validate import (
    check_count,
    check_nonnegative,
    check_positive,
    check_probability,
)
from dpfl.accounting import events as ev
from dpfl.accounting.ledger import MomentsAccountantLedger
from dpfl.data.dataset import FederatedDataset
from dpfl.errors import (
    InvalidParameterError,
)
from dpfl.sim.evaluation import evaluate_model
from dpfl.sim.grad import check_finite, stack_params
from dpfl.sim.local import cohort_sgd_step
from dpfl.sim.loop import check_state_owner, model_state
from dpfl.sim.privatize import CentralGaussian
from dpfl.sim.sampling import FixedCohortSampler, PoissonClientSampler, RoundSample

__all__ = [
    "DpFedAvg",
    "MomentsAccountantLedger",
    "RoundPlan",
    "between_client_variance",
    "schedule_value",
    "update_scale",
]

Params = dict[str, torch.Tensor]
LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
ScheduleSpec = float | int | Sequence[float] | Mapping[str, float]

CLIPPINGS = ("fixed", "median", "adaptive")
SAMPLINGS = ("fixed", "poisson")
EXECUTIONS = ("batched", "loop")


# ----------------------------------------------------------------- schedules
def schedule_value(spec: ScheduleSpec, round_index: int, *, name: str) -> float:
    """The value of a per-round schedule at ``round_index``.

    Parameters
    ----------
    spec : float, int, sequence or mapping
        A constant; a sequence (value of round ``t`` is ``spec[t]``, the last
        value is held after the end); or a linear ramp
        ``{"start": a, "stop": b, "rounds": n}`` going from ``a`` at round 0
        to ``b`` at round ``n - 1`` and held there.
    round_index : int
        The round (>= 0).
    name : str
        The schedule's parameter name, for error messages.

    Returns
    -------
    float
        The scheduled value.

    Raises
    ------
    dpfl.errors.InvalidParameterError
        If the spec is malformed (empty list, missing ramp keys, bad type).
    """
    t = check_count("round_index", round_index, minimum=0)
    if isinstance(spec, bool):
        raise InvalidParameterError(f"{name} must be a number; got {spec!r}")
    if isinstance(spec, int | float | np.integer | np.floating):
        return float(spec)
    if isinstance(spec, Mapping):
        missing = {"start", "stop", "rounds"} - set(spec)
        if missing or set(spec) - {"start", "stop", "rounds"}:
            raise InvalidParameterError(
                f"{name} as a ramp needs exactly the keys start, stop, rounds; "
                f"got {sorted(spec)}"
            )
        n = check_count(f"{name}['rounds']", spec["rounds"], minimum=1)
        a, b = float(spec["start"]), float(spec["stop"])
        frac = 1.0 if n == 1 else min(t / (n - 1), 1.0)
        return a + (b - a) * frac
    if isinstance(spec, Sequence | np.ndarray) and not isinstance(spec, str):
        if len(spec) == 0:
            raise InvalidParameterError(f"{name} must not be an empty list")
        return float(spec[min(t, len(spec) - 1)])
    raise InvalidParameterError(
        f"{name} must be a number, a list or a ramp mapping; got {spec!r}"
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
    u = _as_update_matrix(updates)
    mu = u.mean(0)
    return float((u - mu).pow(2).mean(0).mean())


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
    u = _as_update_matrix(updates)
    return float(u.mean(0).pow(2).mean())


def _as_update_matrix(updates: torch.Tensor | np.ndarray) -> torch.Tensor:
    u = torch.as_tensor(updates, dtype=torch.float64)
    if u.dim() != 2 or u.shape[0] == 0 or u.shape[1] == 0:
        raise InvalidParameterError(
            f"updates must be a non-empty [clients, parameters] matrix; got shape "
            f"{tuple(u.shape)}"
        )
    return u


# --------------------------------------------------------------- the algorithm
@dataclasses.dataclass(frozen=True)
class RoundPlan:
    """Everything a round draws before any computation.

    Attributes
    ----------
    round : int
        Round index.
    sample : RoundSample
        The cohort (and all of each member's records).
    cohort_size : int
        m_t: the scheduled cohort (the divisor of the average).
    noise_multiplier : float or None
        σ_t (``None`` for a non-private run).
    orders : numpy.ndarray
        ``[E, m, n_max]`` int64: row ``[e, j]`` is client ``j``'s visiting
        order of its records in epoch ``e`` (positions in the client's record
        list), padded with ``-1``.
    """

    round: int
    sample: RoundSample
    cohort_size: int
    noise_multiplier: float | None
    orders: np.ndarray


class DpFedAvg:
    """Client-level DP-FedAvg (name ``"dp-fedavg"``).

    Parameters
    ----------
    model : torch.nn.Module
        The model (moved to ``device``; trained in place). No BatchNorm.
    dataset : FederatedDataset
        Clients' records; its test set (if any) is used by :meth:`evaluate`.
    device : str
        Torch device.
    cohort_size : int, list or ramp
        m_t: clients per round (see the module docstring for schedules).
    noise_multiplier : float, list, ramp or None
        σ_t: noise std on the clipped sum in units of the clipping bound.
        ``None`` or 0: non-private (no noise, nothing charged).
    local_epochs : int
        E, local epochs per round.
    batch_size : int
        B, local mini-batch size.
    learning_rate : float
        η, local SGD step size.
    clipping : {"fixed", "median", "adaptive"}
        How the clipping bound S is chosen (module docstring).
    clip : float
        The fixed bound S, or the initial bound C_0 for ``"adaptive"``.
    target_quantile : float
        γ in (0, 1) of the adaptive bound (Andrew et al.: 0.5).
    clip_learning_rate : float
        η_C of the adaptive bound's geometric update (Andrew et al.: 0.2).
    count_noise_multiplier : float or None
        σ_b, the noise std of the adaptive bound's count; default ``m_t/20``.
    sampling : {"fixed", "poisson"}
        Fixed-size cohorts (Algorithm 1) or Poisson client sampling at m_t/K.
    server_learning_rate : float
        Multiplies the noisy average before it is added (paper: 1).
    execution : {"batched", "loop"}
        The whole cohort as one batched computation, or one client at a time.
    max_clients : int or None
        Clients per chunk of the batched step (memory bound).
    eval_batch_size : int
        Batch size of :meth:`evaluate`.
    loss_fn : callable
        ``loss_fn(output, target)``, mean over the batch.

    Attributes
    ----------
    unproven : str or None
        Why the run's ε is not a proven bound whatever the analysis (median
        clipping), or ``None``; a run must opt in to train such a setting.
    clip_bound : float
        Current clipping bound (adaptive) or the fixed one.
    communication_cost : int
        ``Σ_t m_t`` over the rounds run so far (realised cohorts).

    Raises
    ------
    dpfl.errors.InvalidParameterError
        On a parameter outside its domain (the message names it).

    References
    ----------
    Geyer, Klein & Nabi, "Differentially private federated learning: a client
    level perspective", 2017, Algorithm 1 and §3. Andrew, Thakkar, McMahan &
    Ramaswamy, "Differentially private learning with adaptive clipping",
    NeurIPS 2021, Algorithm 1 and Theorem 1.
    """

    name = "dp-fedavg"
    per_client_accounting = False

    def __init__(
        self,
        *,
        model: nn.Module,
        dataset: FederatedDataset,
        device: str = "cpu",
        cohort_size: ScheduleSpec,
        noise_multiplier: ScheduleSpec | None = None,
        local_epochs: int = 1,
        batch_size: int = 10,
        learning_rate: float = 0.1,
        clipping: str = "fixed",
        clip: float = 1.0,
        target_quantile: float = 0.5,
        clip_learning_rate: float = 0.2,
        count_noise_multiplier: float | None = None,
        sampling: str = "fixed",
        server_learning_rate: float = 1.0,
        execution: str = "batched",
        max_clients: int | None = None,
        eval_batch_size: int = 1024,
        loss_fn: LossFn = F.cross_entropy,
    ) -> None:
        if not isinstance(model, nn.Module):
            raise InvalidParameterError(
                f"model must be a torch.nn.Module; got {type(model).__name__}"
            )
        if not isinstance(dataset, FederatedDataset):
            raise InvalidParameterError(
                f"dataset must be a FederatedDataset; got {type(dataset).__name__}"
            )
        for label, value, allowed in (
            ("clipping", clipping, CLIPPINGS),
            ("sampling", sampling, SAMPLINGS),
            ("execution", execution, EXECUTIONS),
        ):
            if value not in allowed:
                raise InvalidParameterError(
                    f"{label} must be one of {allowed}; got {value!r}"
                )
        self.cohort_size = cohort_size
        self.noise_multiplier = noise_multiplier
        self.private = noise_multiplier is not None and not (
            isinstance(noise_multiplier, int | float) and noise_multiplier == 0
        )
        self.local_epochs = check_count("local_epochs", local_epochs, minimum=1)
        self.batch_size = check_count("batch_size", batch_size, minimum=1)
        self.learning_rate = check_positive("learning_rate", learning_rate)
        self.clipping = clipping
        self.clip = check_positive("clip", clip)
        self.target_quantile = check_probability(
            "target_quantile", target_quantile, allow_one=False
        )
        self.clip_learning_rate = check_nonnegative(
            "clip_learning_rate", clip_learning_rate
        )
        self.count_noise_multiplier = (
            None
            if count_noise_multiplier is None
            else check_positive("count_noise_multiplier", count_noise_multiplier)
        )
        self.sampling = sampling
        self.server_learning_rate = check_positive(
            "server_learning_rate", server_learning_rate
        )
        self.execution = execution
        self.max_clients = (
            None
            if max_clients is None
            else check_count("max_clients", max_clients, minimum=1)
        )
        self.eval_batch_size = check_count(
            "eval_batch_size", eval_batch_size, minimum=1
        )
        self.loss_fn = loss_fn
        self.device = str(device)
        self.dataset = dataset
        self.model = model.to(self.device)
        self.num_clients = dataset.num_clients
        self._sizes = dataset.client_sizes()
        if int(self._sizes.sum()) == 0:
            raise InvalidParameterError("dataset has no training records")
        # Validate the schedules at round 0 (later rounds are checked when used).
        self._round_parameters(0)
        #: Why this run's ε is not a proven bound whatever the analysis
        #: (``None``: nothing beyond the analysis itself).
        self.unproven: str | None = (
            "median clipping releases the clipping bound S (the median of the "
            "cohort's update norms) without noise, and that leak is not "
            "charged: the reported epsilon covers the noisy sum only, so it is "
            "not a valid bound for the run (Geyer et al. 2017, Section 3); use "
            "clipping 'fixed' or 'adaptive'"
            if clipping == "median" and self.private
            else None
        )
        self.clip_bound = float(self.clip)
        self.communication_cost = 0
        self._round_index = 0
        self._names = [n for n, _ in self.model.named_parameters()]
        self._shapes = [p.shape for _, p in self.model.named_parameters()]
        self._numels = [p.numel() for _, p in self.model.named_parameters()]

    # -- schedules and accounting ---------------------------------------------
    def _round_parameters(self, t: int) -> tuple[int, float | None]:
        m_raw = schedule_value(self.cohort_size, t, name="cohort_size")
        m = check_count(f"cohort_size (round {t})", int(round(m_raw)), minimum=1)
        if m > self.num_clients:
            raise InvalidParameterError(
                f"cohort_size (round {t}) must be <= the number of clients "
                f"({self.num_clients}); got {m}"
            )
        if not self.private or self.noise_multiplier is None:
            return m, None
        sigma = check_positive(
            f"noise_multiplier (round {t})",
            schedule_value(self.noise_multiplier, t, name="noise_multiplier"),
        )
        if self.clipping == "adaptive":
            self._update_noise_multiplier(sigma, m)  # raises if σ_b is too small
        return m, sigma

    def _count_noise(self, m: int) -> float:
        return (
            self.count_noise_multiplier
            if self.count_noise_multiplier is not None
            else m / 20.0
        )

    def _update_noise_multiplier(self, sigma: float, m: int) -> float:
        """σ_Δ = (σ⁻² − (2σ_b)⁻²)^(-1/2) (Andrew et al. 2021, Thm. 1)."""
        if self.clipping != "adaptive":
            return sigma
        sb = self._count_noise(m)
        rest = sigma**-2 - (2.0 * sb) ** -2
        if rest <= 0:
            raise InvalidParameterError(
                f"adaptive clipping needs 2 * count_noise_multiplier > "
                f"noise_multiplier; got count_noise_multiplier={sb!r}, "
                f"noise_multiplier={sigma!r} (cohort {m})"
            )
        return rest**-0.5

    def _next_round(self) -> int:
        return self._round_index

    def event(self) -> ev.Event | None:
        """The accounting event of the next round.

        Returns
        -------
        Event or None
            ``FixedCohort(m_t, K, Gaussian(σ_t))`` (fixed cohorts) or
            ``ClientPoisson(m_t/K, Gaussian(σ_t))`` (Poisson clients); ``None``
            when non-private. With adaptive clipping σ_t is the *joint*
            multiplier of the update and the count (module docstring).
        """
        m, sigma = self._round_parameters(self._next_round())
        if sigma is None:
            return None
        if self.sampling == "poisson":
            return ev.ClientPoisson(m / self.num_clients, ev.Gaussian(sigma))
        return ev.FixedCohort(m, self.num_clients, ev.Gaussian(sigma))

    # -- planning (all randomness of the numpy generator) ---------------------
    def plan_round(self, round_index: int, rng: np.random.Generator) -> RoundPlan:
        """Draw the cohort and every client's visiting order of its records.

        Parameters
        ----------
        round_index : int
            The round (selects m_t and σ_t).
        rng : numpy.random.Generator
            Draws the cohort, then, epoch by epoch and client by client, a
            permutation of the client's records.

        Returns
        -------
        RoundPlan
            The round's draws.
        """
        m, sigma = self._round_parameters(round_index)
        indices = self.dataset.client_indices
        if self.sampling == "poisson":
            sampler: FixedCohortSampler | PoissonClientSampler = PoissonClientSampler(
                num_clients=self.num_clients,
                participation_probability=m / self.num_clients,
                client_sizes=self._sizes,
                client_indices=indices,
            )
        else:
            sampler = FixedCohortSampler(
                num_clients=self.num_clients,
                cohort_size=m,
                client_sizes=self._sizes,
                client_indices=indices,
            )
        sample = sampler.sample(rng)
        counts = sample.counts()
        n_max = int(counts.max()) if counts.size else 0
        orders = np.full((self.local_epochs, sample.num_clients, n_max), -1, np.int64)
        for e in range(self.local_epochs):
            for j, n in enumerate(counts.tolist()):
                orders[e, j, :n] = rng.permutation(n)
        return RoundPlan(round_index, sample, m, sigma, orders)

    # -- local training ---------------------------------------------------------
    def _params(self) -> Params:
        return {n: p.detach() for n, p in self.model.named_parameters()}

    def _flatten(self, stacked: Mapping[str, torch.Tensor], m: int) -> torch.Tensor:
        return torch.cat([stacked[n].reshape(m, -1) for n in self._names], dim=1)

    def _unflatten(self, flat: torch.Tensor) -> Params:
        parts = torch.split(flat, self._numels)
        return {n: t.reshape(s) for n, t, s in zip(self._names, parts, self._shapes)}

    def _cohort_data(
        self, sample: RoundSample
    ) -> tuple[torch.Tensor, torch.Tensor, np.ndarray]:
        """The cohort's records padded to ``[m, n_max, ...]`` (zeros as padding)."""
        counts = sample.counts()
        m, n_max = sample.num_clients, int(counts.max()) if counts.size else 0
        if sample.records is None:  # samplers built with client_indices resolve
            sample = sample.resolve(self.dataset.client_indices)
        rows = sample.records if sample.records is not None else np.empty(0, np.int64)
        x_np, y_np = self.dataset.take(rows)
        x = torch.as_tensor(np.ascontiguousarray(x_np))
        y = torch.as_tensor(np.ascontiguousarray(y_np))
        slots = np.concatenate(
            [j * n_max + np.arange(n, dtype=np.int64) for j, n in enumerate(counts)]
        )
        x_pad = x.new_zeros((m * n_max, *x.shape[1:]))
        y_pad = y.new_zeros((m * n_max, *y.shape[1:]))
        x_pad[torch.as_tensor(slots)] = x
        y_pad[torch.as_tensor(slots)] = y
        x_pad = x_pad.reshape(m, n_max, *x.shape[1:]).to(self.device)
        y_pad = y_pad.reshape(m, n_max, *y.shape[1:]).to(self.device)
        return x_pad, y_pad, counts

    def client_updates(self, plan: RoundPlan) -> torch.Tensor:
        """Each cohort member's update Δw_k = w_k − w_t after E local epochs.

        Parameters
        ----------
        plan : RoundPlan
            From :meth:`plan_round` (the model is read, not changed).

        Returns
        -------
        torch.Tensor
            ``[m, P]`` flattened updates (parameter order of
            ``model.named_parameters()``); ``[0, P]`` for an empty cohort.

        Raises
        ------
        dpfl.errors.NonFiniteUpdateError
            If a client's gradient or update is NaN or Inf.
        """
        m = plan.sample.num_clients
        params = self._params()
        total = sum(self._numels)
        if m == 0:
            return torch.zeros(0, total, device=self.device)
        x_pad, y_pad, counts = self._cohort_data(plan.sample)
        if self.execution == "loop":
            finals = [
                self._client_loop(params, x_pad[j], y_pad[j], plan.orders[:, j])
                for j in range(m)
            ]
            stacked = {n: torch.stack([f[n] for f in finals]) for n in self._names}
        else:
            stacked = self._cohort_batched(params, x_pad, y_pad, plan.orders)
        start = self._flatten(stack_params(params, m), m)
        updates = self._flatten(stacked, m) - start
        check_finite(updates, "client updates")
        return updates

    def _steps(self, orders: np.ndarray) -> list[np.ndarray]:
        """Batches of one epoch: ``[..., B]`` slices of the visiting orders."""
        n_max = orders.shape[-1]
        b = self.batch_size
        return [orders[..., s : s + b] for s in range(0, n_max, b)]

    def _cohort_batched(
        self,
        params: Params,
        x_pad: torch.Tensor,
        y_pad: torch.Tensor,
        orders: np.ndarray,
    ) -> Params:
        m = x_pad.shape[0]
        stacked = stack_params(params, m)
        rows = torch.arange(m, device=x_pad.device)[:, None]
        for e in range(orders.shape[0]):
            for batch in self._steps(orders[e]):
                idx = torch.as_tensor(batch, device=x_pad.device)
                mask = idx >= 0
                if not bool(mask.any()):
                    continue
                safe = idx.clamp(min=0)
                stacked = cohort_sgd_step(
                    self.model,
                    stacked,
                    x_pad[rows, safe],
                    y_pad[rows, safe],
                    learning_rate=self.learning_rate,
                    loss_fn=self.loss_fn,
                    sample_mask=mask,
                    max_clients=self.max_clients,
                )
        return stacked

    def _client_loop(
        self,
        params: Params,
        x: torch.Tensor,
        y: torch.Tensor,
        orders: np.ndarray,
    ) -> Params:
        """One client's E epochs of mini-batch SGD, one ordinary backward a step."""
        w = {n: t.clone() for n, t in params.items()}
        buffers = dict(self.model.named_buffers())
        for e in range(orders.shape[0]):
            for batch in self._steps(orders[e]):
                sel = batch[batch >= 0]
                if sel.size == 0:
                    continue
                idx = torch.as_tensor(sel, device=x.device)
                leaves = {n: t.requires_grad_(True) for n, t in w.items()}
                with torch.enable_grad():
                    out = functional_call(self.model, (leaves, buffers), (x[idx],))
                    loss = self.loss_fn(out, y[idx])
                    grads = torch.autograd.grad(loss, list(leaves.values()))
                check_finite(grads, "client gradient")
                w = {
                    n: (t - self.learning_rate * g).detach()
                    for (n, t), g in zip(leaves.items(), grads)
                }
        return w

    # -- one round ----------------------------------------------------------------
    def run_round(
        self, round_index: int, rng: np.random.Generator, generator: torch.Generator
    ) -> tuple[np.ndarray, dict[str, float]]:
        """Run Algorithm 1 for one round and update the global model.

        Parameters
        ----------
        round_index : int
            The round (selects m_t and σ_t from the schedules).
        rng : numpy.random.Generator
            Draws the cohort and the local batches.
        generator : torch.Generator
            Draws the noise (update, then count for adaptive clipping).

        Returns
        -------
        tuple
            ``(participants, metrics)``. Metrics: ``participants``,
            ``cohort_size`` (m_t), ``noise_multiplier`` (σ_t, 0 if
            non-private), ``clip_bound`` (S used), ``clip_bound_private``
            (1/0), ``clipped_fraction``, ``update_norm_median``,
            ``between_client_variance`` (V_c), ``update_scale`` (U_s),
            ``communication_cost`` (Σ m_t so far), ``noise_std`` and, for
            adaptive clipping, ``clip_bound_next`` and ``noisy_fraction_under``.

        Raises
        ------
        dpfl.errors.NonFiniteUpdateError
            If an update is not finite; the model and the clip bound are left
            unchanged.
        """
        plan = self.plan_round(round_index, rng)
        updates = self.client_updates(plan)
        m_real = plan.sample.num_clients
        norms = updates.norm(dim=1) if m_real else updates.new_zeros(0)

        # Clipping bound S.
        if self.clipping == "median" and m_real:
            bound = float(torch.quantile(norms.double(), 0.5))
        else:
            bound = self.clip_bound
        metrics: dict[str, float] = {}
        if m_real:
            metrics["between_client_variance"] = between_client_variance(updates)
            metrics["update_scale"] = update_scale(updates)
            metrics["update_norm_median"] = float(torch.quantile(norms.double(), 0.5))
        if bound > 0:
            factor = (bound / norms).clamp(max=1.0) if m_real else norms
        else:  # median of all-zero updates: nothing to send
            factor = torch.zeros_like(norms)
        total = (updates * factor[:, None]).sum(0)

        noise_std = 0.0
        next_bound = self.clip_bound
        if plan.noise_multiplier is not None and bound > 0:
            sigma_update = self._update_noise_multiplier(
                plan.noise_multiplier, plan.cohort_size
            )
            privatizer = CentralGaussian(noise_multiplier=sigma_update, clip=bound)
            total = privatizer.add_noise(
                {"update": total},
                num_participants=m_real,
                num_available=self.num_clients,
                generator=generator,
            )["update"]
            noise_std = sigma_update * bound
        if self.clipping == "adaptive":
            under = float((norms <= self.clip_bound).double().sum())
            count = under - 0.5 * m_real
            if plan.noise_multiplier is not None:
                sb = self._count_noise(plan.cohort_size)
                z = torch.randn(
                    (),
                    generator=generator,
                    device=generator.device,
                    dtype=torch.float64,
                )
                count += float(z) * sb
            frac = count / plan.cohort_size + 0.5
            next_bound = self.clip_bound * math.exp(
                -self.clip_learning_rate * (frac - self.target_quantile)
            )
            metrics["noisy_fraction_under"] = frac
            metrics["clip_bound_next"] = next_bound

        average = total / plan.cohort_size
        check_finite(average, "model update")
        step = self._unflatten(self.server_learning_rate * average)
        with torch.no_grad():
            for n, p in self.model.named_parameters():
                p.add_(step[n].to(p.dtype))
        self.clip_bound = next_bound
        self.communication_cost += m_real
        self._round_index = round_index + 1
        metrics.update(
            participants=float(m_real),
            cohort_size=float(plan.cohort_size),
            noise_multiplier=float(plan.noise_multiplier or 0.0),
            clip_bound=bound,
            clip_bound_private=0.0 if self.clipping == "median" else 1.0,
            clipped_fraction=float((norms > bound).double().mean()) if m_real else 0.0,
            communication_cost=float(self.communication_cost),
            noise_std=noise_std,
            update_norm=float(average.norm()),
        )
        return plan.sample.clients, metrics

    # -- evaluation and state ---------------------------------------------------
    def evaluate(self) -> dict[str, float]:
        """Mean loss and accuracy on the dataset's test set.

        Returns
        -------
        dict of str to float
            ``{"test_loss", "test_accuracy"}``; empty if there is no test set.
        """
        return evaluate_model(
            self.model,
            self.dataset.test_features,
            self.dataset.test_labels,
            loss_fn=self.loss_fn,
            batch_size=self.eval_batch_size,
            device=self.device,
        )

    def state_dict(self) -> dict[str, Any]:
        """Model, clip bound, communication cost and next round (CPU copies).

        Returns
        -------
        dict
            ``{"name", "model", "clip_bound", "communication_cost", "round"}``.
        """
        return {
            "name": self.name,
            "model": model_state(self.model),
            "clip_bound": self.clip_bound,
            "communication_cost": self.communication_cost,
            "round": self._next_round(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`.

        Parameters
        ----------
        state : dict
            From :meth:`state_dict`.

        Raises
        ------
        dpfl.errors.InvalidParameterError
            If the state belongs to another algorithm.
        """
        check_state_owner(state, self.name)
        self.model.load_state_dict(state["model"])
        self.clip_bound = float(state["clip_bound"])
        self.communication_cost = int(state["communication_cost"])
        self._round_index = int(state["round"])
