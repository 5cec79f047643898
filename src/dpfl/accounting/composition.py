"""Composition theorems for (ε, δ)-differential privacy.

Generic bounds that hold for *any* mechanisms with the stated per-step
guarantee: basic composition, the strong (advanced) composition theorem of
Dwork, Rothblum and Vadhan, and the sharper closed form of Kairouz, Oh and
Viswanath.  They are what MS-PAFL (Theorem 4) and LOCKS (Theorem 5.3) use; a
mechanism-specific accountant (privacy-loss distributions, RDP) is almost
always much tighter and should be preferred when the mechanism is known.

References
----------
.. [DRV10] C. Dwork, G. N. Rothblum, S. Vadhan, "Boosting and differential
   privacy", FOCS 2010; Dwork & Roth (2014), Theorem 3.20.
.. [KOV15] P. Kairouz, S. Oh, P. Viswanath, "The composition theorem for
   differential privacy", ICML 2015, Theorem 3.5.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from dpfl._validate import (
    check_count,
    check_delta,
    check_nonnegative,
    check_probability,
)
from dpfl.errors import InvalidParameterError

__all__ = ["basic", "heterogeneous_basic", "strong_drv", "strong_kov"]


def _check_step(
    epsilon: object, delta: object, count: object
) -> tuple[float, float, int]:
    eps = check_nonnegative("epsilon", epsilon)
    dlt = check_probability("delta", delta, allow_zero=True, allow_one=True)
    k = check_count("count", count, minimum=1)
    return eps, dlt, k


def basic(*, epsilon: float, delta: float, count: int) -> tuple[float, float]:
    """Compose ``count`` (ε, δ)-DP mechanisms by basic composition.

    Parameters
    ----------
    epsilon : float
        Per-step ε >= 0.
    delta : float
        Per-step δ in [0, 1].
    count : int
        Number of (adaptively) composed mechanisms, >= 1.

    Returns
    -------
    tuple of float
        ``(count * epsilon, min(1, count * delta))``.

    Raises
    ------
    InvalidParameterError
        If a parameter is outside its domain.

    References
    ----------
    Dwork & Roth (2014), Theorem 3.16.
    """
    eps, dlt, k = _check_step(epsilon, delta, count)
    return k * eps, min(1.0, k * dlt)


def heterogeneous_basic(
    epsilons: Sequence[float], deltas: Sequence[float]
) -> tuple[float, float]:
    """Compose mechanisms with different (ε_i, δ_i) by basic composition.

    Parameters
    ----------
    epsilons : sequence of float
        Per-step ε_i >= 0.
    deltas : sequence of float
        Per-step δ_i in [0, 1], same length as ``epsilons``.

    Returns
    -------
    tuple of float
        ``(sum(epsilons), min(1, sum(deltas)))``.

    Raises
    ------
    InvalidParameterError
        If the sequences are empty, differ in length or hold invalid values.

    References
    ----------
    Dwork & Roth (2014), Theorem 3.16.
    """
    eps_list = list(epsilons)
    dlt_list = list(deltas)
    if len(eps_list) != len(dlt_list):
        raise InvalidParameterError(
            "epsilons and deltas must have the same length; got "
            f"{len(eps_list)} and {len(dlt_list)}"
        )
    if not eps_list:
        raise InvalidParameterError("epsilons must not be empty; got []")
    total_eps = math.fsum(
        check_nonnegative(f"epsilons[{i}]", e) for i, e in enumerate(eps_list)
    )
    total_dlt = math.fsum(
        check_probability(f"deltas[{i}]", d, allow_zero=True)
        for i, d in enumerate(dlt_list)
    )
    return total_eps, min(1.0, total_dlt)


def strong_drv(
    *, epsilon: float, delta: float, count: int, delta_slack: float
) -> tuple[float, float]:
    """Strong (advanced) composition of Dwork, Rothblum and Vadhan.

    ``count`` adaptively composed (ε, δ)-DP mechanisms are (ε_tot, δ_tot)-DP with
    ε_tot = sqrt(2 k ln(1/δ̃)) ε + k ε (e^ε - 1) and δ_tot = k δ + δ̃.
    This is MS-PAFL's Theorem 4 (eq. 23a-b, docs/analyses.md).

    Parameters
    ----------
    epsilon : float
        Per-step ε >= 0.
    delta : float
        Per-step δ in [0, 1].
    count : int
        Number of composed mechanisms k >= 1.
    delta_slack : float
        The slack δ̃ in (0, 1).

    Returns
    -------
    tuple of float
        ``(epsilon_total, delta_total)``; δ_tot is capped at 1.

    Raises
    ------
    InvalidParameterError
        If a parameter is outside its domain.

    Notes
    -----
    Advanced composition of random participation's per-round (0.015, 1e-6) over
    T = 10,000 gives ε ≈ 10.2 at δ ≈ 1e-2 in this form with
    δ̃ = 1e-6, which gives ε = 10.152 at δ_tot = 1.0001e-2 (δ̃ = 1e-2 would give
    6.82 at δ_tot = 2e-2; the KOV form reaches δ_tot = 1e-2 with ε = 7.8).

    References
    ----------
    .. [1] C. Dwork, G. N. Rothblum, S. Vadhan, "Boosting and differential
       privacy", FOCS 2010; Dwork & Roth (2014), Theorem 3.20.
    """
    eps, dlt, k = _check_step(epsilon, delta, count)
    slack = check_delta("delta_slack", delta_slack)
    eps_tot = math.sqrt(2.0 * k * math.log(1.0 / slack)) * eps + k * eps * math.expm1(
        eps
    )
    return eps_tot, min(1.0, k * dlt + slack)


def strong_kov(
    *, epsilon: float, delta: float, count: int, delta_slack: float
) -> tuple[float, float]:
    """Strong composition in the closed form of Kairouz, Oh and Viswanath.

    With x = ε, k = ``count`` and δ̃ = ``delta_slack``:
    ε_tot = min{k x, k x tanh(x/2) + x sqrt(2k ln(e + x sqrt(k)/δ̃)),
    k x tanh(x/2) + x sqrt(2k ln(1/δ̃))} and δ_tot = 1 - (1-δ)^k (1-δ̃)
    (docs/analyses.md, the "tighter drop-in" for Theorem 4).  Both ε_tot and δ_tot are
    never larger than :func:`strong_drv`'s, and ε_tot never exceeds basic
    composition's k ε.

    Parameters
    ----------
    epsilon : float
        Per-step ε >= 0.
    delta : float
        Per-step δ in [0, 1].
    count : int
        Number of composed mechanisms k >= 1.
    delta_slack : float
        The slack δ̃ in (0, 1).

    Returns
    -------
    tuple of float
        ``(epsilon_total, delta_total)``.

    Raises
    ------
    InvalidParameterError
        If a parameter is outside its domain.

    References
    ----------
    .. [1] P. Kairouz, S. Oh, P. Viswanath, "The composition theorem for
       differential privacy", ICML 2015, Theorem 3.5.
    """
    eps, dlt, k = _check_step(epsilon, delta, count)
    slack = check_delta("delta_slack", delta_slack)
    drift = k * eps * math.tanh(eps / 2.0)  # = k ε (e^ε - 1)/(e^ε + 1)
    option_a = drift + eps * math.sqrt(
        2.0 * k * math.log(math.e + eps * math.sqrt(k) / slack)
    )
    option_b = drift + eps * math.sqrt(2.0 * k * math.log(1.0 / slack))
    eps_tot = min(k * eps, option_a, option_b)
    # 1 - (1-δ)^k (1-δ̃), computed without cancellation.
    log_keep = k * math.log1p(-dlt) + math.log1p(-slack) if dlt < 1 else -math.inf
    return eps_tot, -math.expm1(log_keep)
