"""MS-PAFL's guarantees for the global public model: Theorems 2 and 4.

The formulas of Li, Wang, Tian, Wang and Su (MS-PAFL, arXiv 2509.25906) for
parties that see the global public model only, not who checked in, as
reconstructed in docs/analyses.md:

* :func:`hoeffding_tail`, :func:`binomial_tail`, :func:`central_round` —
  Theorem 2 / Corollary 1 (one round of the global public model), with the
  exact binomial tail in place of Hoeffding by default (docs/analyses.md);
  :func:`poisson_binomial_tail`, :func:`central_round_clients` — Theorem 2's
  heterogeneous form (eq. 19: per-client p_k, γ_k);
* :func:`global_total` — Theorem 4 (strong composition, DRV or KOV form).

They amplify by check-in and data subsampling, which the server's view of
who checked in and the hidden private submodel invalidate: dpfl reports them
as the paper's figures, labelled ``"invalid"``
(:data:`dpfl.accounting.schemes.FORMULAS`), beside the sound guarantee
against the parameter server (:func:`dpfl.accounting.checkin.sound_client`).
The local guarantees (Lemma 1, Theorems 1 and 3) are in
:mod:`dpfl.accounting.checkin`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from scipy import stats

from dpfl._validate import (
    check_count,
    check_delta,
    check_positive,
    check_probability,
)
from dpfl.accounting import composition
from dpfl.errors import InvalidParameterError

__all__ = [
    "binomial_tail",
    "central_round",
    "central_round_clients",
    "global_total",
    "hoeffding_tail",
    "poisson_binomial_tail",
]


# ---------------------------------------------------------------------------
# Theorem 2 / Corollary 1
# ---------------------------------------------------------------------------
def _check_tail_args(
    clients: object, probability: object, xi: object
) -> tuple[int, float, float]:
    k = check_count("clients", clients, minimum=1)
    p = check_probability("probability", probability)
    x = check_probability("xi", xi, allow_one=False)
    return k, p, x


def hoeffding_tail(
    *, clients: int, probability: float, xi: float, one_sided: bool = False
) -> float:
    """Hoeffding bound on the check-in count deviating from its mean (Lemma 2).

    P(|N - Kp| >= ξKp) <= 2 exp(-2 K p² ξ²); the one-sided lower tail
    P(N <= (1-ξ)Kp), which is all Theorem 2 needs, drops the factor 2.

    Parameters
    ----------
    clients : int
        Number of clients K >= 1.
    probability : float
        Check-in probability p in (0, 1].
    xi : float
        Relative deviation ξ in (0, 1).
    one_sided : bool, optional
        Bound the lower tail only.  Default False (the paper's two-sided form).

    Returns
    -------
    float
        δ_H, capped at 1.

    Raises
    ------
    InvalidParameterError
        If a parameter is outside its domain.

    References
    ----------
    MS-PAFL Lemma 2 (eq. A.2); Hoeffding (1963).
    """
    k, p, x = _check_tail_args(clients, probability, xi)
    factor = 1.0 if one_sided else 2.0
    return min(1.0, factor * math.exp(-2.0 * k * p * p * x * x))


def _threshold(mean: float, xi: float) -> int:
    """Smallest integer N with N >= (1-ξ)·mean, robust to float round-off."""
    target = (1.0 - xi) * mean
    nearest = round(target)
    if abs(target - nearest) <= 1e-9 * max(1.0, target):
        return int(nearest)
    return math.ceil(target)


def binomial_tail(*, clients: int, probability: float, xi: float) -> float:
    """Exact probability that fewer than (1-ξ)Kp clients check in.

    δ_H = P(N < (1-ξ)Kp) = BinomCDF(ceil((1-ξ)Kp) - 1; K, p), the exact value of
    the event Theorem 2 conditions away (docs/analyses.md).

    Parameters
    ----------
    clients : int
        Number of clients K >= 1.
    probability : float
        Check-in probability p in (0, 1].
    xi : float
        Relative deviation ξ in (0, 1).

    Returns
    -------
    float
        δ_H in [0, 1].

    Raises
    ------
    InvalidParameterError
        If a parameter is outside its domain.

    Notes
    -----
    (1-ξ)Kp is compared with integers to a relative tolerance of 1e-9, so that
    K = 1000, p = 0.1, ξ = 0.5 gives threshold 50 (and δ_H = P(N <= 49)), as the
    decimal inputs mean, whatever the floating-point round-off.

    References
    ----------
    docs/analyses.md.
    """
    k, p, x = _check_tail_args(clients, probability, xi)
    threshold = _threshold(k * p, x)
    if threshold <= 0:
        return 0.0
    return float(stats.binom.cdf(threshold - 1, k, p))


def central_round(
    *,
    epsilon: float,
    delta: float,
    clients: int,
    probability: float,
    gamma: float,
    xi: float,
    tail: str = "binomial",
) -> tuple[float, float]:
    """One round of the global public model (MS-PAFL Theorem 2 / Corollary 1).

    With ε_agg = ε / sqrt((1-ξ)Kp):
    ε_c = ln(1 + pγ(e^{ε_agg} - 1)) + ln(1/(1 - δ_H)) (20a),
    δ_c = pγδ + δ_H (20b).

    The guarantee protects one record (replace-one) against parties that see
    the global public model only, *not* who checked in, and assumes σ was set
    by Lemma 1 from (ε, δ): the sum of at least (1-ξ)Kp noises of std σ is
    then the classic Gaussian mechanism at ε_agg, valid while ε_agg < 1.
    Against the parameter server use
    :func:`~dpfl.accounting.checkin.sound_client` (docs/analyses.md).

    Parameters
    ----------
    epsilon : float
        Per-client local ε > 0 (Lemma 1).
    delta : float
        Per-client local δ in (0, 1).
    clients : int
        Number of clients K >= 1.
    probability : float
        Check-in probability p in (0, 1].
    gamma : float
        Data subsampling ratio γ in (0, 1].
    xi : float
        Hoeffding parameter ξ in (0, 1).
    tail : {"binomial", "hoeffding", "hoeffding-one-sided"}, optional
        How δ_H is computed.  "binomial" (default) is the exact tail;
        "hoeffding" is the paper's two-sided bound.

    Returns
    -------
    tuple of float
        ``(epsilon_c, delta_c)``; ε_c is ``inf`` when δ_H = 1.

    Raises
    ------
    InvalidParameterError
        If a parameter is outside its domain, ε_agg >= 1 (the classic formula
        does not apply), or ``tail`` is unknown.

    References
    ----------
    MS-PAFL Theorem 2, Corollary 1 (eq. 20a-b), App. A-B; docs/analyses.md.
    """
    k, p, _ = _check_tail_args(clients, probability, xi)
    g = check_probability("gamma", gamma)
    eps_c, delta_c = central_round_clients(
        epsilon=epsilon,
        delta=delta,
        probabilities=np.full(k, p),
        gammas=g,
        xi=xi,
        tail=tail,
    )
    return float(eps_c[0]), float(delta_c[0])


def _probabilities(name: str, values: Sequence[float] | np.ndarray) -> np.ndarray:
    arr = np.asarray(values, dtype=float)
    if arr.ndim != 1 or arr.size == 0:
        raise InvalidParameterError(
            f"{name} must be a non-empty 1-d sequence; got shape {arr.shape}"
        )
    bad = ~((arr > 0) & (arr <= 1))
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise InvalidParameterError(
            f"{name} must all lie in (0, 1]; got {arr[i]!r} at index {i}"
        )
    return arr


def poisson_binomial_tail(
    *, probabilities: Sequence[float] | np.ndarray, xi: float
) -> float:
    """Exact probability that fewer than (1-ξ)·Σp_j clients check in.

    N = Σ_j 1_j with independent 1_j ~ Bernoulli(p_j) (Poisson-binomial);
    δ_H = P(N < (1-ξ) Σ_j p_j), the event Theorem 2 (eq. 19) conditions away.
    The distribution of N is built exactly by convolving one binomial per
    distinct p_j (all terms positive, so tails far below 1e-16 stay accurate).

    Parameters
    ----------
    probabilities : sequence of float
        Check-in probabilities p_j in (0, 1], one per client.
    xi : float
        Relative deviation ξ in (0, 1).

    Returns
    -------
    float
        δ_H in [0, 1].

    Raises
    ------
    InvalidParameterError
        If a parameter is outside its domain.

    References
    ----------
    MS-PAFL Theorem 2 (eq. 19) and Lemma 2; docs/analyses.md.
    """
    p = _probabilities("probabilities", probabilities)
    x = check_probability("xi", xi, allow_one=False)
    threshold = _threshold(float(p.sum()), x)
    if threshold <= 0:
        return 0.0
    values, counts = np.unique(p, return_counts=True)
    pmf = np.ones(1)
    for value, count in zip(values, counts):
        pmf = np.convolve(pmf, stats.binom.pmf(np.arange(count + 1), count, value))
        pmf = pmf[:threshold]  # only P(N < threshold) is needed
    return float(min(1.0, pmf.sum()))


def central_round_clients(
    *,
    epsilon: float,
    delta: float,
    probabilities: Sequence[float] | np.ndarray,
    gammas: float | Sequence[float] | np.ndarray,
    xi: float,
    tail: str = "binomial",
) -> tuple[np.ndarray, np.ndarray]:
    """Theorem 2 with per-client check-in p_k and subsampling γ_k (eq. 19).

    With S = Σ_j p_j (the expected number of check-ins) and
    ε_agg = ε / sqrt((1-ξ) S), client k's record is protected in one round of
    the global public model with
    ε_c,k = ln(1 + p_k γ_k (e^{ε_agg} - 1)) + ln(1/(1 - δ_H)) and
    δ_c,k = p_k γ_k δ + δ_H, where δ_H bounds P(N < (1-ξ) S): the exact
    Poisson-binomial tail (default) or Hoeffding's 2 exp(-2 ξ² S² / K). With
    all p_k = p and γ_k = γ this is :func:`central_round`.

    Parameters
    ----------
    epsilon : float
        Per-client local ε > 0 (Lemma 1).
    delta : float
        Per-client local δ in (0, 1).
    probabilities : sequence of float
        p_k in (0, 1], one per client (K = its length).
    gammas : float or sequence of float
        γ_k in (0, 1], one per client or one for all.
    xi : float
        Hoeffding parameter ξ in (0, 1).
    tail : {"binomial", "hoeffding", "hoeffding-one-sided"}, optional
        How δ_H is computed ("binomial": the exact Poisson-binomial tail).

    Returns
    -------
    tuple of numpy.ndarray
        ``(epsilon_c, delta_c)``, one entry per client; the paper's figure for
        the run is the largest (the client with the largest p_k γ_k).

    Raises
    ------
    InvalidParameterError
        If a parameter is outside its domain, ε_agg >= 1, or ``tail`` is
        unknown.

    References
    ----------
    MS-PAFL Theorem 2 (eq. 19), App. A-B; docs/analyses.md.
    """
    eps = check_positive("epsilon", epsilon)
    dlt = check_delta("delta", delta)
    p = _probabilities("probabilities", probabilities)
    g = np.broadcast_to(
        _probabilities("gammas", np.atleast_1d(np.asarray(gammas, dtype=float))),
        p.shape,
    )
    x = check_probability("xi", xi, allow_one=False)
    k, total = p.size, float(p.sum())
    if tail == "binomial":
        delta_h = poisson_binomial_tail(probabilities=p, xi=x)
    elif tail in ("hoeffding", "hoeffding-one-sided"):
        factor = 2.0 if tail == "hoeffding" else 1.0
        delta_h = min(1.0, factor * math.exp(-2.0 * x * x * total * total / k))
    else:
        raise InvalidParameterError(
            "tail must be 'binomial', 'hoeffding' or 'hoeffding-one-sided'; "
            f"got {tail!r}"
        )
    eps_agg = eps / math.sqrt((1.0 - x) * total)
    if eps_agg >= 1:
        raise InvalidParameterError(
            "epsilon / sqrt((1 - xi) * sum(probabilities)) must be < 1 for "
            f"Theorem 2; got {eps_agg!r}"
        )
    if delta_h >= 1:
        return np.full(k, math.inf), np.ones(k)
    eps_c = np.log1p(p * g * math.expm1(eps_agg)) - math.log1p(-delta_h)
    return eps_c, np.minimum(1.0, p * g * dlt + delta_h)


# ---------------------------------------------------------------------------
# Theorem 4
# ---------------------------------------------------------------------------
def global_total(
    *,
    eps_max: float,
    delta_max: float,
    rounds: int,
    delta_slack: float,
    method: str = "drv",
) -> tuple[float, float]:
    """Total loss of the global model over R rounds (MS-PAFL Theorem 4).

    Parameters
    ----------
    eps_max : float
        Largest per-round ε_c >= 0 (e.g. from :func:`central_round`).
    delta_max : float
        Largest per-round δ_c in [0, 1].
    rounds : int
        Number of rounds R >= 1.
    delta_slack : float
        Slack δ̃ in (0, 1).
    method : {"drv", "kov"}, optional
        "drv" (default): the paper's eq. 23a-b (Dwork-Rothblum-Vadhan);
        "kov": Kairouz-Oh-Viswanath Theorem 3.5, never larger.

    Returns
    -------
    tuple of float
        ``(epsilon_total, delta_total)``.

    Raises
    ------
    InvalidParameterError
        If a parameter is outside its domain or ``method`` is unknown.

    References
    ----------
    MS-PAFL Theorem 4; see :mod:`dpfl.accounting.composition`.
    """
    if method == "drv":
        fn = composition.strong_drv
    elif method == "kov":
        fn = composition.strong_kov
    else:
        raise InvalidParameterError(f"method must be 'drv' or 'kov'; got {method!r}")
    return fn(epsilon=eps_max, delta=delta_max, count=rounds, delta_slack=delta_slack)
