"""Balle et al. 2020's random check-ins: the fixed-window amplification bound.

Not to be confused with :mod:`dpfl.accounting.checkin` (MS-PAFL's check-in,
where every checked-in client joins the round's Gaussian sum).

Protocol (Balle, Kairouz, McMahan, Thakkar & Thakurta, "Privacy Amplification
via Random Check-Ins", NeurIPS 2020, Algorithm 1, ``A_fix``): ``n`` clients
each hold **one** record. Each client independently, with probability ``p0``,
checks in to one step chosen uniformly from a fixed window of ``m`` steps.
At each step the (trusted) server picks one of the clients that checked in to
that step uniformly at random (or performs a dummy step if none did) and asks
it for an update computed by a **local randomizer** ``A_ldp`` that is
``ε0``-DP (or ``(ε0, δ0)``-DP) with respect to *any* change of the client's
record. The released output is the sequence of ``m`` updates.

Theorem 3.2 (as implemented here, ``ε0 <= 1``, ``δ <= 1/100``):
``A_fix`` is ``(ε, δ)``-DP with ``ε = 7 p0 ε0 sqrt(log(1/δ) / m)``; if
``A_ldp`` is only ``(ε0, δ0)``-DP with
``δ0 <= (1 - e^{-ε0}) δ1 / (4 e^{ε0} (2 + log(2/δ1) / log(1/(1 - e^{-5 ε0}))))``,
``A_fix`` is ``(ε', δ')``-DP with ``ε' = 7 p0 ε0 sqrt(log(1/δ) / m)`` and
``δ' = δ + m (e^{ε'} + 1) δ1``.

The statement and its constants (7, ``ε0 <= 1``, ``δ <= 1/100``, the ``δ0``
condition) are transcribed from the published theorem; the tests check
dpfl's arithmetic against an independent evaluation of this statement, not
the transcription itself, so check it against the paper before quoting a
number from it. The module is used for the comparison only: no run is
charged with it.

Status (dpfl's terms, :data:`ANALYSIS`): **proven**, for its own protocol.
It is *not* an analysis of Hasircioglu & Gündüz's random participation
(:mod:`dpfl.accounting.participation`), and the two numbers answer different
questions: there, every participating client sends the *sum* of its
Poisson-sampled records' clipped gradients and a trusted server adds one
central Gaussian to the total, the unit is one record among ``d`` per client
and neighbouring datasets differ by adding or removing a record; here, one
client (one record) is used per step, privacy comes from each client's own
local randomizer, and neighbouring datasets differ by replacing a client's
record. Hasircioglu & Gündüz (arXiv 2205.01556, §5.3, Figure 4) nevertheless
compare the two at p0 = p = 0.1, C = 1, σ = 3, reading Balle et al.'s bound
for a Gaussian local randomizer; :func:`gaussian_fixed_window_epsilon` makes
that reading with the theorem's conditions checked.
"""

from __future__ import annotations

import math

import numpy as np

from dpfl._validate import check_count, check_delta, check_positive, check_probability
from dpfl.accounting import gaussian
from dpfl.accounting.schemes import Analysis
from dpfl.errors import InvalidParameterError

__all__ = [
    "ANALYSIS",
    "MAX_DELTA",
    "MAX_LOCAL_EPSILON",
    "TheoremConditionError",
    "fixed_window_approx",
    "fixed_window_epsilon",
    "gaussian_fixed_window_epsilon",
    "max_local_delta",
]

#: The theorem's hypotheses: ``ε0 <= 1`` and ``δ <= 1/100``.
MAX_LOCAL_EPSILON = 1.0
MAX_DELTA = 0.01

ANALYSIS = Analysis(
    "balle2020-fixed-window",
    "proven",
    "Balle, Kairouz, McMahan, Thakkar & Thakurta, NeurIPS 2020, Theorem 3.2 "
    "(random check-ins into a fixed window, Algorithm 1 A_fix): a proven bound "
    "for that protocol (one record per client, one client per step, an "
    "eps0-DP local randomizer); not an analysis of random participation's "
    "central-Gaussian sum over sampled records",
    adversary="sees the m released updates (a trusted server picks who "
    "answers), not who checked in",
    neighbouring="replace-one client's (single) record",
)


class TheoremConditionError(InvalidParameterError):
    """A parameter lies outside the hypotheses of Balle et al.'s Theorem 3.2."""


def _check_local_epsilon(local_epsilon: float) -> float:
    e0 = check_positive("local_epsilon", local_epsilon)
    if e0 > MAX_LOCAL_EPSILON:
        raise TheoremConditionError(
            f"local_epsilon must be <= {MAX_LOCAL_EPSILON} (Balle et al. 2020, "
            f"Theorem 3.2 assumes eps0 <= 1); got {local_epsilon!r}"
        )
    return e0


def _check_theorem_delta(name: str, delta: float) -> float:
    d = check_delta(name, delta)
    if d > MAX_DELTA:
        raise TheoremConditionError(
            f"{name} must be <= {MAX_DELTA} (Balle et al. 2020, Theorem 3.2 "
            f"assumes delta <= 1/100); got {delta!r}"
        )
    return d


def _epsilon(p0: float, e0: float, m: int, delta: float) -> float:
    return 7.0 * p0 * e0 * math.sqrt(math.log(1.0 / delta) / m)


def fixed_window_epsilon(
    delta: float,
    *,
    local_epsilon: float,
    checkin_probability: float,
    steps: int,
) -> float:
    """ε of ``A_fix`` with a pure ``ε0``-DP local randomizer (Theorem 3.2).

    ``ε = 7 p0 ε0 sqrt(log(1/δ) / m)``.

    Parameters
    ----------
    delta : float
        Target δ in (0, 1/100].
    local_epsilon : float
        ε0 of the local randomizer, in (0, 1].
    checkin_probability : float
        p0, the probability that a client checks in, in (0, 1].
    steps : int
        m, the number of steps in the fixed window (>= 1).

    Returns
    -------
    float
        ε such that ``A_fix`` is (ε, δ)-DP for replace-one of a client's record.

    Raises
    ------
    TheoremConditionError
        If ``local_epsilon > 1`` or ``delta > 1/100`` (outside the theorem).
    InvalidParameterError
        If a parameter is not a number in its range.

    References
    ----------
    .. [1] Balle, Kairouz, McMahan, Thakkar and Thakurta, "Privacy Amplification
       via Random Check-Ins", NeurIPS 2020, Theorem 3.2.
    """
    p0 = check_probability("checkin_probability", checkin_probability)
    m = check_count("steps", steps, minimum=1)
    e0 = _check_local_epsilon(local_epsilon)
    d = _check_theorem_delta("delta", delta)
    return _epsilon(p0, e0, m, d)


def max_local_delta(local_epsilon: float, delta1: float) -> float:
    """The largest δ0 Theorem 3.2 admits for an ``(ε0, δ0)``-DP local randomizer.

    ``δ0 <= (1 - e^{-ε0}) δ1 / (4 e^{ε0} (2 + log(2/δ1) / log(1/(1 - e^{-5 ε0}))))``.

    Parameters
    ----------
    local_epsilon : float
        ε0 in (0, 1].
    delta1 : float
        δ1 in (0, 1): the per-step slack that enters ``δ' = δ + m (e^{ε'} + 1) δ1``.

    Returns
    -------
    float
        The bound on δ0 (increasing in ``delta1``).

    Raises
    ------
    TheoremConditionError
        If ``local_epsilon > 1``.
    InvalidParameterError
        If a parameter is not a number in its range.
    """
    e0 = _check_local_epsilon(local_epsilon)
    d1 = check_delta("delta1", delta1)
    return _max_local_delta(e0, d1)


def _max_local_delta(e0: float, d1: float) -> float:
    log_term = -math.log1p(-math.exp(-5.0 * e0))  # log(1 / (1 - e^{-5 eps0}))
    denom = 4.0 * math.exp(e0) * (2.0 + math.log(2.0 / d1) / log_term)
    return -math.expm1(-e0) * d1 / denom


def fixed_window_approx(
    delta: float,
    *,
    local_epsilon: float,
    local_delta: float,
    delta1: float,
    checkin_probability: float,
    steps: int,
) -> tuple[float, float]:
    """(ε', δ') of ``A_fix`` with an ``(ε0, δ0)``-DP local randomizer (Theorem 3.2).

    ``ε' = 7 p0 ε0 sqrt(log(1/δ) / m)`` and ``δ' = δ + m (e^{ε'} + 1) δ1``,
    provided ``δ0 <= max_local_delta(ε0, δ1)``.

    Parameters
    ----------
    delta : float
        δ in (0, 1/100] of the pure part.
    local_epsilon, local_delta : float
        The local randomizer's (ε0, δ0): ε0 in (0, 1], δ0 in [0, 1).
    delta1 : float
        δ1 in (0, 1).
    checkin_probability : float
        p0 in (0, 1].
    steps : int
        m >= 1.

    Returns
    -------
    (float, float)
        (ε', δ').

    Raises
    ------
    TheoremConditionError
        If ``local_epsilon > 1``, ``delta > 1/100`` or ``local_delta`` exceeds
        :func:`max_local_delta`.
    InvalidParameterError
        If a parameter is not a number in its range.
    """
    eps = fixed_window_epsilon(
        delta,
        local_epsilon=local_epsilon,
        checkin_probability=checkin_probability,
        steps=steps,
    )
    d0 = check_probability("local_delta", local_delta, allow_zero=True, allow_one=False)
    limit = max_local_delta(local_epsilon, delta1)
    if d0 > limit:
        raise TheoremConditionError(
            f"local_delta must be <= {limit:.6g} for local_epsilon = "
            f"{local_epsilon!r} and delta1 = {delta1!r} (Balle et al. 2020, "
            f"Theorem 3.2's condition on delta0); got {local_delta!r}"
        )
    m = check_count("steps", steps, minimum=1)
    return eps, float(delta) + m * (math.exp(eps) + 1.0) * float(delta1)


def _smallest_delta1(e0: float, d0: float) -> float:
    """Smallest δ1 in (0, 1) with ``d0 <= max_local_delta(e0, δ1)``; inf if none."""
    if d0 <= 0.0:
        return 0.0
    hi = 1.0 - 1e-12
    if _max_local_delta(e0, hi) < d0:
        return math.inf
    lo = 1e-300
    if _max_local_delta(e0, lo) >= d0:
        return lo
    for _ in range(200):  # bisection in log space; max_local_delta increases in δ1
        mid = math.exp(0.5 * (math.log(lo) + math.log(hi)))
        if _max_local_delta(e0, mid) >= d0:
            hi = mid
        else:
            lo = mid
        if hi / lo < 1 + 1e-12:
            break
    return hi


def gaussian_fixed_window_epsilon(
    total_delta: float,
    *,
    noise_multiplier: float,
    checkin_probability: float,
    steps: int,
    sensitivity: float = 2.0,
    grid: int = 200,
) -> float:
    """Smallest ε' that Theorem 3.2 certifies at δ' <= total_delta, Gaussian randomizer.

    The local randomizer adds ``N(0, (noise_multiplier · C)^2 I)`` to a record's
    update clipped to norm ``C``; it is ``(ε0, δ0(ε0))``-DP with the exact
    Gaussian δ0 (Balle & Wang 2018, Theorem 8) at ℓ2-sensitivity
    ``sensitivity · C``. A local randomizer must be DP for *any* two inputs,
    so two clipped updates differ by up to ``2C``: ``sensitivity = 2`` is the
    local-DP reading (1 reads ``C`` as the sensitivity, as an add/remove
    central analysis would). Every ``ε0`` on a grid of ``(0, 1]`` is tried
    with the smallest admissible ``δ1``; δ is the largest with
    ``δ + m (e^{ε'} + 1) δ1 <= total_delta`` (and ``δ <= 1/100``). Every value
    returned is certified by the theorem at a grid point; the grid only makes
    it slightly larger than the theorem's optimum.

    Parameters
    ----------
    total_delta : float
        δ' in (0, 1).
    noise_multiplier : float
        σ / C (> 0).
    checkin_probability : float
        p0 in (0, 1].
    steps : int
        m >= 1.
    sensitivity : float, default 2.0
        The randomizer's ℓ2-sensitivity in units of C.
    grid : int, default 200
        Grid points for ε0 and for δ.

    Returns
    -------
    float
        ε', or ``inf`` when no (ε0, δ1, δ) meets the theorem's conditions
        within ``total_delta`` (the theorem gives no guarantee there).

    Raises
    ------
    InvalidParameterError
        If a parameter is not a number in its range.
    """
    target = check_delta("total_delta", total_delta)
    sigma = check_positive("noise_multiplier", noise_multiplier)
    p0 = check_probability("checkin_probability", checkin_probability)
    m = check_count("steps", steps, minimum=1)
    sens = check_positive("sensitivity", sensitivity)
    n = check_count("grid", grid, minimum=2)
    best = math.inf
    top = min(MAX_DELTA, target)
    deltas = np.geomspace(top, top * 1e-12, n)  # largest δ first
    for e0 in np.linspace(MAX_LOCAL_EPSILON / n, MAX_LOCAL_EPSILON, n):
        e0 = float(e0)
        d0 = gaussian.delta_for_epsilon(e0, noise_multiplier=sigma, sensitivity=sens)
        d1 = _smallest_delta1(e0, d0)
        if not math.isfinite(d1):
            continue
        for d in deltas:  # ε' decreases in δ: the first feasible δ is the best
            eps = _epsilon(p0, e0, m, float(d))
            if eps >= best:
                break
            if d + m * (math.exp(eps) + 1.0) * d1 <= target:
                best = eps
                break
    return best
