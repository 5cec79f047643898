"""Dirac canaries inserted into a real dpfl run, and what the run releases.

A canary is a unit whose contribution to the privatized sum is a fixed
direction of norm C on one coordinate of the model, ``C e_j`` (a *Dirac*
canary; Nasr, Hayes, Steinke, Balle, Tramèr, Jagielski, Carlini & Terzis,
"Tight auditing of differentially private machine learning", USENIX Security
2023, §4):

``client`` level (DP-FedAvg, ``"dp-fedavg"``)
    ``n`` canary clients join the federation; the run's own sampler draws
    them like every client, and a canary client that is drawn sends the
    clipped update ``C e_j`` in place of local training.
``record`` level (DP-DSGD with random participation, ``"dsgd-rp"``)
    ``n`` canary records, each held by a client of its own; the run's own
    sampler draws the client (w.p. p) and the record (w.p. q), and a drawn
    canary record's clipped per-sample gradient is ``C e_j`` (a *gradient
    canary*).

Everything else is the real run: the real clients' local training or
per-sample gradients on the embedded digits, the algorithm's server step,
its privatizer drawing the noise from the run's generators, the ledger that
prices the run. The hook only wraps three methods of the algorithm object
(:class:`CanaryHook`): the cohort's client step (canaries' messages are
written, the real clients' are computed as usual) and the step that turns
the noisy sum into the model update (where the white-box observer reads it).

**Neighbouring pair.** A canary that is *in* contributes ``C e_j`` when drawn;
one that is *out* contributes ``0`` (add/remove events: a client or record
whose contribution is zero changes no output distribution, so this is the
run without it) or ``−C e_j`` (replace-one events, the fixed-cohort analysis
of DP-FedAvg: the canary client replaced by one that sends the opposite
update, a neighbour at distance 2C).

**White-box** (the adversary sees each round's noisy sum). In the threat
model of DP the adversary knows everything but the noise and the canary's
membership: the other clients' data, hence (given the public model of the
round) the clipped contributions of those who were drawn, which the auditor
subtracts (recorded from the run: they are a function of the public history).
What is left on coordinate ``j`` in round ``t`` is, in units of C,

    y_{j,t} = b_{j,t} · a + σ z_{j,t},   a ∈ {a₀ (out), a₁ (in)},

with ``b_{j,t}`` the canary's participation (Bernoulli of its per-round rate)
and ``z`` the privatizer's standard normal noise. Knowing who *else* was
drawn must not reveal whether the canary was: it does not when units are
sampled independently (Poisson clients, random participation) or all take
part (a cohort of every client); with a fixed cohort of m < K clients the
other m − 1 (or m) reveal it, so the white-box audit refuses that setting
(the audit would condition on the secret sampling and overstate ε).

**Black-box** (the adversary sees the final model only). The run also records
each canary coordinate's total movement ``(w_T − w_0)_j``
(:attr:`CanaryRun.movement`). The scores and the audits that read them are
in :mod:`dpfl.audit.training`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from dpfl._validate import check_count, check_delta, check_positive
from dpfl.accounting import events as ev
from dpfl.accounting.ledger import PrivacyLedger
from dpfl.data.dataset import FederatedDataset
from dpfl.errors import InvalidParameterError
from dpfl.sim.algorithms import build_algorithm
from dpfl.sim.algorithms.base import FederatedAlgorithm, Messages
from dpfl.sim.algorithms.registry import algorithm_class
from dpfl.sim.algorithms.tasks import Task

__all__ = ["LEVELS", "CanaryHook", "CanaryRun", "canary_dataset", "canary_run"]

#: The audited algorithms and the level of their canaries.
LEVELS = {"dp-fedavg": "client", "dsgd-rp": "record"}


# ------------------------------------------------------------------ the data
def canary_dataset(
    dataset: FederatedDataset, canaries: int, *, level: str
) -> FederatedDataset:
    """``dataset`` with ``canaries`` canary clients appended (after the real ones).

    ``client``: each canary client holds no record (it never trains: its
    update is written by :class:`CanaryHook`). ``record``: each holds one new
    record (zero features, label 0) whose gradient the hook writes.
    """
    n = check_count("canaries", canaries, minimum=1)
    if level == "client":
        extra = [np.empty(0, dtype=np.int64) for _ in range(n)]
        return dataclasses.replace(
            dataset, client_indices=list(dataset.client_indices) + extra
        )
    if level != "record":
        raise InvalidParameterError(
            f"level must be one of ['client', 'record']; got {level!r}"
        )
    base = len(dataset.labels)
    features = np.asarray(dataset.features)
    features = np.concatenate(
        [features, np.zeros((n, *features.shape[1:]), dtype=features.dtype)]
    )
    labels = np.concatenate([dataset.labels, np.zeros(n, dtype=np.int64)])
    extra = [np.array([base + i], dtype=np.int64) for i in range(n)]
    test_ix = dataset.client_test_indices
    return dataclasses.replace(
        dataset,
        features=features,
        labels=labels,
        client_indices=list(dataset.client_indices) + extra,
        client_test_indices=None
        if test_ix is None
        else list(test_ix) + [np.empty(0, dtype=np.int64)] * n,
    )


# ------------------------------------------------------------------ the hook
class CanaryHook:
    """Writes the canaries' contributions into a run and records what it releases.

    Wraps, on the algorithm *object* only (nothing in the engine changes),
    ``client_steps`` (the batched cohort step: the real clients' messages are
    computed by the algorithm itself, the canaries' are written) and the step
    where the noisy sum becomes the update (``server_update`` for DP-FedAvg:
    the released noisy average, before any server optimiser; ``estimate`` for
    DP-DSGD), where the white-box observer reads the noisy sum.

    Parameters
    ----------
    algorithm : FederatedAlgorithm
        A ``"dp-fedavg"`` (fixed clipping) or ``"dsgd-rp"`` (trusted server)
        algorithm built on :func:`canary_dataset`'s data.
    coordinates : numpy.ndarray
        ``[n]`` distinct model coordinates, canary ``i`` on ``coordinates[i]``.
    values : numpy.ndarray
        ``[n]`` each canary's contribution in units of C (1: in; 0 or −1: out;
        anything else: a deliberately broken canary, e.g. left unclipped).
    real_units : int
        Clients (client level) or records (record level) before the canaries.
    """

    def __init__(
        self,
        algorithm: FederatedAlgorithm,
        coordinates: np.ndarray,
        values: np.ndarray,
        *,
        real_units: int,
    ) -> None:
        name = type(algorithm).name
        if name not in LEVELS:
            raise InvalidParameterError(
                f"algorithm must be one of {sorted(LEVELS)} for a canary audit; "
                f"got {name!r}"
            )
        self.algorithm = algorithm
        self.level = LEVELS[name]
        self.coordinates = np.asarray(coordinates, dtype=np.int64)
        if len(np.unique(self.coordinates)) != self.coordinates.size:
            raise InvalidParameterError("coordinates must be distinct")
        if self.coordinates.max(initial=0) >= algorithm.num_weights:
            raise InvalidParameterError(
                f"coordinates must be < the model's {algorithm.num_weights} weights"
            )
        self.values = torch.as_tensor(np.asarray(values, dtype=np.float64))
        self.real_units = int(real_units)
        self.clip = float(algorithm.params.clip)  # type: ignore[attr-defined]
        self.observations: list[np.ndarray] = []
        self._real_sum: torch.Tensor | None = None
        self._coords_t = torch.as_tensor(self.coordinates)
        self._inner_steps = algorithm.client_steps
        algorithm.client_steps = self._client_steps  # type: ignore[method-assign]
        if self.level == "client":
            self._inner_update = algorithm.server_update
            self._inner_server = algorithm.server_step
            algorithm.server_update = self._server_update  # type: ignore[method-assign]
            algorithm.server_step = self._server_step  # type: ignore[method-assign]
        else:
            self._inner_estimate = algorithm.estimate  # type: ignore[attr-defined]
            algorithm.estimate = self._estimate  # type: ignore[attr-defined]

    # -- the cohort's messages ------------------------------------------------
    def _canary_sum(self, index: np.ndarray, like: torch.Tensor) -> torch.Tensor:
        """``[d]``: the sum of the contributions of canaries ``index``."""
        out = torch.zeros(like.numel(), dtype=torch.float64)
        idx = torch.as_tensor(index, dtype=torch.int64)
        out.index_add_(0, self._coords_t[idx], self.values[idx] * self.clip)
        return out.to(like.device)

    def _client_steps(
        self, weights: torch.Tensor, tasks: Sequence[Task], streams: Sequence[Any]
    ) -> Messages:
        if self.level == "client":
            real = [j for j, t in enumerate(tasks) if t.client < self.real_units]
            canary = np.array(
                [
                    t.client - self.real_units
                    for t in tasks
                    if t.client >= self.real_units
                ],
                dtype=np.int64,
            )
            msgs = self._inner_steps(
                weights, [tasks[j] for j in real], [streams[j] for j in real]
            )
            self._real_sum = msgs.total().detach().double().clone()
            if canary.size == 0:
                return msgs
            # The drawn canaries' messages enter as their sum, one row: the
            # release (sum + noise) is the same, and a [canaries, d] matrix
            # of one-hot rows would not fit in memory for large audits. The
            # round's diagnostics (norms, variance) then see them as one client.
            row = self._canary_sum(canary, weights)[None].to(msgs.vectors.dtype)
            device = msgs.vectors.device  # every tensor of a Messages lives there
            norm = torch.linalg.vector_norm(row.double()).reshape(1).to(device)
            before = msgs.scalars.get(
                "norm", torch.zeros(0, dtype=torch.float64, device=device)
            )
            scalars = {"norm": torch.cat([before.double().to(device), norm])}
            return Messages(torch.cat([msgs.vectors, row]), scalars)
        # record level: strip the canary records, write their clipped gradients
        stripped, found = [], []
        for t in tasks:
            held = np.asarray(t.rows, dtype=np.int64)
            is_canary = held >= self.real_units
            found.append(held[is_canary] - self.real_units)
            stripped.append(dataclasses.replace(t, rows=held[~is_canary]))
        msgs = self._inner_steps(weights, stripped, streams)
        total = msgs.total()
        self._real_sum = total.detach().double().clone()
        canary = np.concatenate(found) if found else np.empty(0, np.int64)
        if canary.size:
            total += self._canary_sum(canary, weights).to(total.dtype)
            if "records" in msgs.scalars:
                msgs.scalars["records"] = msgs.scalars["records"] + float(canary.size)
        return msgs

    # -- where the noisy sum is released ----------------------------------------
    def _server_step(self, cohort: Any, messages: Messages, server: Any) -> Any:
        self._cohort_size = float(cohort.info["cohort_size"])
        return self._inner_server(cohort, messages, server)

    def _server_update(
        self, delta: torch.Tensor, *, learning_rate: float = 1.0
    ) -> torch.Tensor:
        noisy_sum = delta.detach().double() * self._cohort_size
        self._observe(noisy_sum)
        return self._inner_update(delta, learning_rate=learning_rate)

    def _estimate(self, cohort: Any, messages: Messages) -> Any:
        estimate, norm = self._inner_estimate(cohort, messages)
        scale = float(self.algorithm.scale)  # type: ignore[attr-defined]
        self._observe(estimate.detach().double() / scale)
        return estimate, norm

    def _observe(self, noisy_sum: torch.Tensor) -> None:
        real = self._real_sum
        if real is None:
            raise InvalidParameterError("the canary hook saw no cohort step")
        y = (noisy_sum - real.to(noisy_sum.device))[self._coords_t] / self.clip
        self.observations.append(y.cpu().numpy())
        self._real_sum = None


# ------------------------------------------------------------------ one run
@dataclasses.dataclass(frozen=True)
class CanaryRun:
    """What one canary run released, seen from the canaries' coordinates.

    Attributes
    ----------
    observations : numpy.ndarray
        ``[n, T]`` white-box observations ``y_{j,t}`` in units of C.
    movement : numpy.ndarray
        ``[n]`` black-box: ``(w_T − w_0)`` on each canary's coordinate.
    values : numpy.ndarray
        ``[n]`` each canary's contribution (in units of C).
    included : numpy.ndarray
        ``[n]`` bool, whether the canary is in.
    rate : float
        A canary's per-round participation probability.
    noise : float
        The noise std on the sum, in units of C.
    out_value : float
        An out canary's contribution (0 add/remove, −1 replace-one).
    reported_epsilon : float
        dpfl's upper bound for the run at ``delta`` (its ledger).
    delta : float
        The δ of ``reported_epsilon``.
    event : dpfl.accounting.events.Event
        The round's event the ledger priced.
    algorithm : str
        The algorithm's registered name.
    """

    observations: np.ndarray
    movement: np.ndarray
    values: np.ndarray
    included: np.ndarray
    rate: float
    noise: float
    out_value: float
    reported_epsilon: float
    delta: float
    event: ev.Event
    algorithm: str


def _rate_and_pair(alg: FederatedAlgorithm, white_box: bool) -> tuple[float, float]:
    """Per-round canary rate and the out value, from the round's event."""
    event = alg.event(0)
    if event is None:
        raise InvalidParameterError(
            "noise_multiplier must be > 0 for an audit (a non-private run "
            "releases the canaries exactly)"
        )
    if isinstance(event, ev.FixedCohort):
        full = event.cohort_size == event.population
        if white_box and not full:
            raise InvalidParameterError(
                "a white-box canary audit needs sampling 'poisson' or a cohort of "
                f"every client: with a fixed cohort of {event.cohort_size} of "
                f"{event.population} the other clients drawn reveal whether the "
                "canary was, which the guarantee keeps secret"
            )
        return event.sampling_probability, -1.0
    if isinstance(event, ev.ClientPoisson):
        inner = event.event
        if isinstance(inner, ev.RecordPoisson):  # canary client holds one record
            return event.sampling_probability * inner.sampling_probability, 0.0
        return event.sampling_probability, 0.0
    raise InvalidParameterError(
        f"no canary audit for the round event {type(event).__name__}"
    )


def canary_run(
    algorithm: str,
    params: Mapping[str, Any],
    dataset: FederatedDataset,
    *,
    noise_multiplier: float,
    model: Callable[[FederatedDataset], nn.Module],
    canaries: int,
    included: np.ndarray,
    rounds: int,
    delta: float,
    seed: int,
    canary_norm: float = 1.0,
    white_box: bool = True,
    coordinate_seed: int = 0,
) -> CanaryRun:
    """Train a real run with ``canaries`` Dirac canaries; return what it released.

    Parameters
    ----------
    algorithm : str
        ``"dp-fedavg"`` (fixed clipping) or ``"dsgd-rp"`` (trusted server).
    params : mapping
        The algorithm's parameters (its ``algorithm.params`` section); a
        cohort size counts the canary clients among the clients.
    dataset : FederatedDataset
        The real data (canaries are appended).
    noise_multiplier : float
        σ of the run (> 0).
    model : callable
        Builds the model (seeded) for the data it is given.
    canaries : int
        n (at most the model's weights).
    included : numpy.ndarray
        ``[n]`` bool, which canaries are in.
    rounds : int
        T, rounds trained.
    delta : float
        δ of the reported ε.
    seed : int
        The run's seed (sampling, noise, local training).
    canary_norm : float
        An in canary's norm in units of C: 1 is a correct canary; > 1 plays a
        client whose update the implementation forgot to clip.
    white_box : bool
        Whether the observations will be used white-box (checks the setting).
    coordinate_seed : int
        Seed of the choice of the canaries' coordinates.

    Returns
    -------
    CanaryRun
        Observations, movement and the run's reported ε.
    """
    from dpfl.sim.loop import Trainer

    n = check_count("canaries", canaries, minimum=1)
    rounds = check_count("rounds", rounds, minimum=1)
    delta = check_delta("delta", delta)
    check_positive("canary_norm", canary_norm)
    inc = np.asarray(included, dtype=bool).reshape(-1)
    if inc.size != n:
        raise InvalidParameterError(
            f"included must hold one flag per canary ({n}); got {inc.size}"
        )
    name = algorithm_class(algorithm).name
    level = LEVELS.get(name)
    if level is None:
        raise InvalidParameterError(
            f"algorithm must be one of {sorted(LEVELS)} for a canary audit; got "
            f"{algorithm!r}"
        )
    check_positive("noise_multiplier", noise_multiplier)
    real_units = (
        len(dataset.client_indices) if level == "client" else len(dataset.labels)
    )
    data = canary_dataset(dataset, n, level=level)
    alg = build_algorithm(
        name, params, model=model(data), dataset=data, noise_multiplier=noise_multiplier
    )
    d = alg.num_weights
    if n > d:
        raise InvalidParameterError(
            f"canaries must be <= the model's weights ({d}) (one coordinate each); "
            f"got {n}"
        )
    clipping = getattr(alg.params, "clipping", "fixed")
    server = getattr(alg.params, "server", "trusted")
    if level == "client" and clipping != "fixed":
        raise InvalidParameterError(
            f"a canary audit of dp-fedavg needs clipping 'fixed'; got {clipping!r}"
        )
    if level == "record" and server != "trusted":
        raise InvalidParameterError(
            f"a canary audit of dsgd-rp needs server 'trusted'; got {server!r}"
        )
    rate, out_value = _rate_and_pair(alg, white_box)
    values = np.where(inc, float(canary_norm), out_value)
    coords = np.random.default_rng(coordinate_seed).choice(d, size=n, replace=False)
    hook = CanaryHook(alg, coords, values, real_units=real_units)
    start = alg.weights.detach().double().cpu().numpy()[coords]
    ledger = PrivacyLedger(None)
    # An audit is an experiment on the mechanism, re-run exactly from its seed;
    # its models are never released, so its noise is the seeded kind.
    trainer = Trainer(
        alg, ledger=ledger, seed=seed, execution="batched", secure_noise=False
    )
    trainer.run(rounds)
    end = alg.weights.detach().double().cpu().numpy()[coords]
    event = alg.event(0)
    assert event is not None
    return CanaryRun(
        observations=np.stack(hook.observations, axis=1),
        movement=end - start,
        values=values,
        included=inc,
        rate=float(rate),
        noise=float(alg.noise_multiplier),
        out_value=out_value,
        reported_epsilon=float(ledger.epsilon(delta).upper),
        delta=delta,
        event=event,
        algorithm=type(alg).name,
    )
