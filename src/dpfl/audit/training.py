"""Training audits: lower bounds on ε from Dirac canaries in a real dpfl run.

A run with canaries (:func:`dpfl.audit.canaries.canary_run`: what a canary
is, the neighbouring pair it audits and what the white-box and black-box
observers see) is scored canary by canary, and the scores are turned into
an ε lower bound by one of two protocols (:func:`audit_training`).

**Why one run gives many independent trials.** Canaries sit on *disjoint*
coordinates, each canary's participation is drawn independently of every
other's, and the Gaussian noise is iid across coordinates. So the vectors
``(y_{j,t})_t`` of different canaries (the white-box observations of
:mod:`dpfl.audit.canaries`) are independent, each distributed
exactly as the one-canary mechanism on the pair (``a₀``, ``a₁``): a run with
``n`` canaries is ``n`` independent runs of the one-canary experiment, seen
through the coordinate the adversary watches. The score of canary ``j`` is
the exact log-likelihood ratio of the T-round Poisson-subsampled Gaussian,
``Σ_t ln[(1 − r) φ(y − 0) + r φ(y − a₁)] − ln[(1 − r) φ(y) + r φ(y − a₀)]``
with ``φ`` the N(0, σ²) density and ``r`` the per-round rate (the
Neyman–Pearson optimal test of the pair). The ``multi-run`` protocol pools
these trials over one or more runs, chooses the threshold on pilot trials and
counts errors on the rest (:func:`dpfl.audit.stats.score_audit`).

**Black-box** (final model only). The score is the canary coordinate's total
movement ``±(w_T − w_0)_j``; the real clients' training also moves it and
couples the coordinates, so the trials are not independent and only the
one-run protocol applies.

**One run** (Steinke, Nasr & Jagielski 2023; :mod:`dpfl.audit.onerun`).
Each canary is in w.p. 1/2; the auditor guesses "in" for the highest scores
and "out" for the lowest, with the numbers of guesses chosen on a pilot share
of the canaries (whose memberships are then part of the fixed data), and
bounds ε from the correct guesses; valid for any dependence between canaries.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
from torch import nn

from dpfl._validate import check_count
from dpfl.audit.canaries import LEVELS, CanaryRun, canary_run
from dpfl.audit.onerun import OneRunResult, one_run_epsilon, one_run_guesses
from dpfl.audit.stats import AuditResult, clopper_pearson_upper, score_audit
from dpfl.data.dataset import FederatedDataset
from dpfl.errors import InvalidParameterError

__all__ = [
    "TrainingAudit",
    "audit_training",
    "white_box_scores",
]

THREATS = ("white-box", "black-box")
PROTOCOLS = ("multi-run", "one-run")


# ------------------------------------------------------------------ scores
def white_box_scores(run: CanaryRun, *, assumed_norm: float = 1.0) -> np.ndarray:
    """Each canary's T-round log-likelihood ratio (in against out), ``[n]``.

    The score assumes the pair the guarantee is about (in: ``assumed_norm``,
    out: ``run.out_value``); a broken canary of another norm still gets a
    valid test, only not the optimal one.
    """
    y = run.observations
    s2 = run.noise**2
    r = run.rate

    def log_mix(mean: float) -> np.ndarray:
        at = -((y - mean) ** 2) / (2 * s2)
        if r >= 1.0:
            return at
        at0 = -(y**2) / (2 * s2)
        return np.logaddexp(math.log1p(-r) + at0, math.log(r) + at)

    return np.asarray((log_mix(assumed_norm) - log_mix(run.out_value)).sum(axis=1))


# ------------------------------------------------------------------ audits
@dataclasses.dataclass(frozen=True)
class TradeoffPoint:
    """An empirical (FPR, FNR) with two-sided Clopper–Pearson intervals."""

    fpr: float
    fpr_low: float
    fpr_high: float
    fnr: float
    fnr_low: float
    fnr_high: float


@dataclasses.dataclass(frozen=True)
class TrainingAudit:
    """A training audit's outcome.

    Attributes
    ----------
    epsilon : float
        The lower bound on ε at ``delta`` (holds w.p. >= ``confidence``).
    delta, confidence : float
        What it is for.
    reported_epsilon : float
        dpfl's upper bound for the audited run(s) at ``delta``.
    ratio : float
        ``epsilon / reported_epsilon``.
    protocol, threat : str
        ``"multi-run"`` / ``"one-run"``; ``"white-box"`` / ``"black-box"``.
    algorithm, level : str
        The algorithm's name and ``"client"`` / ``"record"``.
    runs, canaries, rounds : int
        Runs trained, canaries per run, rounds per run.
    rate, noise_multiplier : float
        A canary's per-round rate and σ.
    out_value : float
        An out canary's contribution (0: add/remove, −1: replace-one).
    detail : dict
        The protocol's counts (:class:`~dpfl.audit.stats.AuditResult` or
        :class:`~dpfl.audit.onerun.OneRunResult` as data).
    points : list of TradeoffPoint
        Empirical trade-off points of the score test on the counted canaries.
    seconds : float
        Wall time of the training runs.
    """

    epsilon: float
    delta: float
    confidence: float
    reported_epsilon: float
    ratio: float
    protocol: str
    threat: str
    algorithm: str
    level: str
    runs: int
    canaries: int
    rounds: int
    rate: float
    noise_multiplier: float
    out_value: float
    detail: dict[str, Any]
    points: list[TradeoffPoint]
    seconds: float

    def to_dict(self) -> dict[str, Any]:
        """Plain data (JSON ready)."""
        return dataclasses.asdict(self)


def _two_sided(k: int, n: int, confidence: float) -> tuple[float, float]:
    from scipy import stats

    a = (1.0 - confidence) / 2.0
    low = 0.0 if k == 0 else float(stats.beta.ppf(a, k, n - k + 1))
    high = clopper_pearson_upper(k, n, 1.0 - a)
    return low, high


def tradeoff_points(
    null: np.ndarray, alt: np.ndarray, *, confidence: float = 0.95, count: int = 16
) -> list[TradeoffPoint]:
    """(FPR, FNR) of "reject when score > τ" at ``count`` thresholds, with CIs.

    The intervals are two-sided Clopper–Pearson at ``confidence`` each
    (pointwise, for reading the figure; the ε bound uses its own).
    """
    null, alt = np.sort(null), np.sort(alt)
    both = np.concatenate([null, alt])
    # Quantiles on a geometric grid towards both tails, where the claim bites.
    tail = np.geomspace(10.0 / both.size, 0.5, count // 2)
    qs = np.quantile(both, np.unique(np.concatenate([tail, 1.0 - tail])))
    out = []
    for tau in qs:
        fp = int(null.size - np.searchsorted(null, tau, side="right"))
        fn = int(np.searchsorted(alt, tau, side="right"))
        fl, fh = _two_sided(fp, null.size, confidence)
        nl, nh = _two_sided(fn, alt.size, confidence)
        out.append(TradeoffPoint(fp / null.size, fl, fh, fn / alt.size, nl, nh))
    return out


def _best_guesses(
    scores: np.ndarray, included: np.ndarray, *, delta: float, confidence: float
) -> tuple[float, float]:
    """Fractions (k₊/n, k₋/n) maximising the one-run bound on pilot canaries."""
    n = scores.size
    grid = np.unique(np.concatenate([[0.0], np.geomspace(4.0 / n, 0.5, 12)]))
    order = np.argsort(scores, kind="stable")
    inc = included[order]
    top = np.concatenate([[0], np.cumsum(inc[::-1])])  # correct among top k
    bottom = np.concatenate([[0], np.cumsum(~inc)])  # correct among bottom k
    best, arg = -1.0, (grid[1], 0.0)
    for fi in grid:
        for fo in grid:
            ki, ko = int(round(fi * n)), int(round(fo * n))
            if ki + ko == 0 or ki + ko > n:
                continue
            v = int(top[ki] + bottom[ko])
            e = one_run_epsilon(
                n, ki + ko, v, delta=delta, confidence=confidence, tolerance=1e-2
            )
            if e > best:
                best, arg = e, (fi, fo)
    return arg


def audit_training(
    algorithm: str,
    params: Mapping[str, Any],
    dataset: FederatedDataset,
    *,
    noise_multiplier: float,
    model: Callable[[FederatedDataset], nn.Module],
    canaries: int,
    rounds: int,
    delta: float,
    protocol: str = "multi-run",
    threat: str = "white-box",
    runs: int = 1,
    confidence: float = 0.95,
    pilot_fraction: float = 0.2,
    seed: int = 0,
    canary_norm: float = 1.0,
) -> TrainingAudit:
    """An ε lower bound for a real training run, from Dirac canaries.

    Parameters
    ----------
    algorithm, params, dataset, noise_multiplier, model
        The run, as for :func:`canary_run`.
    canaries : int
        Canaries per run.
    rounds : int
        T, rounds per run.
    delta : float
        δ of the bound.
    protocol : {"multi-run", "one-run"}
        Independent trials pooled over ``runs`` runs (white-box only), or
        Steinke et al.'s one-run bound (on each run's canaries; with several
        runs the best-scoring run is *not* picked: their counts are pooled as
        one larger run would be, which the theorem allows since runs are
        independent).
    threat : {"white-box", "black-box"}
        What the adversary sees (module docstring).
    runs : int
        Independent runs (seeds ``seed``, ``seed + 1``, ...).
    confidence : float
        Probability that the bound holds.
    pilot_fraction : float
        Share of the canaries (or trials) used to choose the test, never counted.
    seed : int
        Seed of the runs and of the canaries' memberships.
    canary_norm : float
        In-canary norm in units of C (> 1: a deliberately unclipped canary).

    Returns
    -------
    TrainingAudit
        The bound, the reported ε, their ratio and the trade-off points.
    """
    import time

    if protocol not in PROTOCOLS:
        raise InvalidParameterError(
            f"protocol must be one of {list(PROTOCOLS)}; got {protocol!r}"
        )
    if threat not in THREATS:
        raise InvalidParameterError(
            f"threat must be one of {list(THREATS)}; got {threat!r}"
        )
    if protocol == "multi-run" and threat == "black-box":
        raise InvalidParameterError(
            "the black-box canaries of one run are not independent trials (the real "
            "training couples the coordinates): use protocol 'one-run'"
        )
    runs = check_count("runs", runs, minimum=1)
    n = check_count("canaries", canaries, minimum=2)
    if not 0.0 < pilot_fraction < 1.0:
        raise InvalidParameterError(
            f"pilot_fraction must be in (0, 1); got {pilot_fraction!r}"
        )
    rng = np.random.default_rng([seed, 0xA0D17])
    t0 = time.perf_counter()
    scores, incl, reported = [], [], []
    last: CanaryRun | None = None
    for k in range(runs):
        if protocol == "multi-run":
            inc = np.zeros(n, dtype=bool)
            inc[rng.permutation(n)[: n // 2]] = True
        else:
            inc = rng.random(n) < 0.5
        run = canary_run(
            algorithm,
            params,
            dataset,
            noise_multiplier=noise_multiplier,
            model=model,
            canaries=n,
            included=inc,
            rounds=rounds,
            delta=delta,
            seed=seed + k,
            canary_norm=canary_norm,
            white_box=threat == "white-box",
            coordinate_seed=seed + k,
        )
        s = (
            white_box_scores(run)
            if threat == "white-box"
            else run.movement * (1.0 - run.out_value)
        )
        scores.append(s)
        incl.append(inc)
        reported.append(run.reported_epsilon)
        last = run
    seconds = time.perf_counter() - t0
    assert last is not None
    score = np.concatenate(scores)
    inc_all = np.concatenate(incl)
    pilot = rng.random(score.size) < pilot_fraction
    counted = ~pilot
    null, alt = score[counted & ~inc_all], score[counted & inc_all]
    if null.size == 0 or alt.size == 0:
        raise InvalidParameterError(
            "too few canaries: the counted share holds no in or no out canary"
        )
    detail: dict[str, Any]
    if protocol == "multi-run":
        res: AuditResult = score_audit(
            null,
            alt,
            delta=delta,
            confidence=confidence,
            pilot_null=score[pilot & ~inc_all],
            pilot_alt=score[pilot & inc_all],
        )
        eps, detail = res.epsilon, res.to_dict()
    else:
        fi, fo = _best_guesses(
            score[pilot], inc_all[pilot], delta=delta, confidence=confidence
        )
        m = int(counted.sum())
        one: OneRunResult = one_run_guesses(
            score[counted],
            inc_all[counted],
            guess_in=min(m, int(round(fi * m))),
            guess_out=min(m - int(round(fi * m)), int(round(fo * m))),
            delta=delta,
            confidence=confidence,
        )
        eps, detail = one.epsilon, one.to_dict()
    rep = max(reported)
    return TrainingAudit(
        epsilon=float(eps),
        delta=delta,
        confidence=confidence,
        reported_epsilon=rep,
        ratio=float(eps / rep) if rep > 0 else math.inf,
        protocol=protocol,
        threat=threat,
        algorithm=last.algorithm,
        level=LEVELS[last.algorithm],
        runs=runs,
        canaries=n,
        rounds=rounds,
        rate=last.rate,
        noise_multiplier=last.noise,
        out_value=last.out_value,
        detail=detail,
        points=tradeoff_points(null, alt, confidence=confidence),
        seconds=seconds,
    )
