"""Rényi-DP (moments accountant) analyses: client-level DP-FedAvg and LOCKS.

dp_accounting is the engine for RDP: its :class:`RdpAccountant` (with the
improved RDP-to-DP conversion of Balle et al. 2020 unless stated otherwise).
The PLD analyses (``"sound"``, ``"paper-pld"``) are dpfl's
:class:`~dpfl.accounting.accountant.Accountant`, whose compositions are
certified at every delta.  dp_accounting's absl log messages and Python
warnings are silenced here; orders it cannot evaluate are dropped by it,
which only makes the bound more conservative.

DP-FedAvg (Geyer, Klein & Nabi 2017) analyses, by ``analysis`` (the
default first; the statuses are those of
:data:`dpfl.accounting.schemes.FIXED_COHORT`):

``"sound"`` (default; proven)
    The fixed-size cohort as it is sampled, uniformly without replacement,
    under replace-one of a client: the sum's sensitivity is 2S, and each
    round is C_{m/K}(G_{2/σ}) (Dong, Roth & Su 2022, WOR subsampling under
    replace-one), symmetrised before composition, priced by PLD.
``"sound-rdp"`` (proven, looser)
    The same scheme with the RDP bound of Wang, Balle & Kasiviswanathan
    (2019) and dp_accounting's RDP-to-DP conversion.
``"paper"`` (not valid for fixed cohorts)
    The paper's moments accountant: the cohort read as Poisson sampling,
    q_t = m_t/K, add/remove of one client; RDP at the integer moments
    λ = 1..32 of Abadi et al. (2016), converted by their rule
    δ = min_λ exp(α(λ) − λε) (equivalently ε = min_λ (α(λ) + ln 1/δ)/λ).
    Valid only if clients are Poisson-sampled at rate m_t/K.
``"paper-rdp"`` (not valid for fixed cohorts)
    The same Poisson reading with the improved RDP-to-DP conversion of Balle
    et al. (2020) on a fine grid of orders.
``"paper-pld"`` (not valid for fixed cohorts)
    The same Poisson reading with a tight PLD accountant.

LOCKS: :func:`locks_server_view` (exact Gaussian composition of a client's
realised releases against the server, which sees who sent what); both views
of a recorded run are :func:`dpfl.accounting.reports.locks_report`.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import math
from collections.abc import Sequence
from typing import Any, cast

import numpy as np
from dp_accounting import dp_event
from dp_accounting.privacy_accountant import NeighboringRelation
from dp_accounting.rdp import rdp_privacy_accountant

from dpfl._validate import (
    check_count,
    check_delta,
    check_nonnegative,
    check_positive,
)
from dpfl.accounting import costs, gaussian, pricing
from dpfl.accounting import events as ev
from dpfl.accounting._quiet import quiet as _quiet
from dpfl.accounting.bounds import Bound
from dpfl.accounting.events import FixedCohort, Gaussian
from dpfl.errors import InvalidParameterError

__all__ = [
    "ANALYSES",
    "dp_fedavg_delta",
    "dp_fedavg_epsilon",
    "dp_fedavg_stop_round",
    "locks_server_view",
    "rdp_to_dp",
]

#: Analyses accepted by the DP-FedAvg functions (the default first).
ANALYSES = ("sound", "sound-rdp", "paper", "paper-rdp", "paper-pld")
#: The RDP analyses (the others are priced by privacy-loss distributions).
_RDP = ("sound-rdp", "paper", "paper-rdp")

#: RDP orders: dp_accounting's defaults, plus a finer grid of integers.
_ORDERS = np.array(
    [1 + x / 10.0 for x in range(1, 100)]
    + list(range(11, 64))
    + [80, 96, 128, 192, 256, 384, 512, 768, 1024]
)

#: Abadi et al.'s moments: λ = 1..32, i.e. RDP orders 2..33.
_ABADI_ORDERS = np.arange(2, 34, dtype=float)


def _check_analysis(analysis: str) -> str:
    if analysis not in ANALYSES:
        raise InvalidParameterError(
            f"analysis must be one of {ANALYSES}; got {analysis!r}"
        )
    return analysis


def _schedule(
    clients: object,
    cohort_sizes: Sequence[int] | int,
    noise_multipliers: Sequence[float] | float,
    rounds: int | None,
) -> tuple[int, list[tuple[int, float]]]:
    """Validate and expand the (m_t, σ_t) schedule to one pair per round."""
    k = check_count("clients", clients, minimum=1)
    cohort_seq = not isinstance(cohort_sizes, (int, np.integer)) and isinstance(
        cohort_sizes, Sequence | np.ndarray
    )
    noise_seq = isinstance(noise_multipliers, Sequence | np.ndarray)
    lengths = set()
    if cohort_seq:
        lengths.add(len(cohort_sizes))  # type: ignore[arg-type]
    if noise_seq:
        lengths.add(len(noise_multipliers))  # type: ignore[arg-type]
    if rounds is not None:
        lengths.add(check_count("rounds", rounds, minimum=1))
    if not lengths:
        raise InvalidParameterError(
            "rounds must be given when cohort_sizes and noise_multipliers are "
            "scalars; got None"
        )
    if len(lengths) > 1:
        raise InvalidParameterError(
            "cohort_sizes, noise_multipliers and rounds disagree on the number of "
            f"rounds; got lengths {sorted(lengths)}"
        )
    t = lengths.pop()
    if t < 1:
        raise InvalidParameterError(f"the schedule must have >= 1 round; got {t}")
    if not cohort_seq and not noise_seq:  # one (m, σ) for every round: check it once
        one = _schedule(
            k, [cast(int, cohort_sizes)], [cast(float, noise_multipliers)], None
        )[1]
        return k, one * t
    ms = list(cohort_sizes) if cohort_seq else [cohort_sizes] * t  # type: ignore[arg-type]
    zs = list(noise_multipliers) if noise_seq else [noise_multipliers] * t  # type: ignore[arg-type]
    out = []
    for i, (m, z) in enumerate(zip(ms, zs)):
        mm = check_count(f"cohort_sizes[{i}]", m, minimum=1)
        if mm > k:
            raise InvalidParameterError(
                f"cohort_sizes[{i}] must be <= clients ({k}); got {m!r}"
            )
        out.append((mm, check_positive(f"noise_multipliers[{i}]", z)))
    return k, out


@functools.lru_cache(maxsize=4096)
def _round_rdp(
    analysis: str, clients: int, cohort: int, noise: float
) -> tuple[float, ...]:
    """RDP of one round at the analysis's orders (cached per distinct round)."""
    orders = list(_orders(analysis))
    if analysis in ("paper", "paper-rdp"):
        acc = rdp_privacy_accountant.RdpAccountant(orders)
        event: dp_event.DpEvent = dp_event.PoissonSampledDpEvent(
            cohort / clients, dp_event.GaussianDpEvent(noise)
        )
    else:  # "sound-rdp": WOR, replace-one, sensitivity 2S -> multiplier σ/2
        acc = rdp_privacy_accountant.RdpAccountant(
            orders, NeighboringRelation.REPLACE_ONE
        )
        event = dp_event.SampledWithoutReplacementDpEvent(
            clients, cohort, dp_event.GaussianDpEvent(noise / 2.0)
        )
    with _quiet():
        acc.compose(event)
    return tuple(float(v) for v in acc.rdp)


def _orders(analysis: str) -> np.ndarray:
    return _ABADI_ORDERS if analysis == "paper" else _ORDERS


def _total_rdp(
    analysis: str, clients: int, schedule: list[tuple[int, float]]
) -> np.ndarray:
    total = np.zeros_like(_orders(analysis), dtype=float)
    for (m, z), count in collections.Counter(schedule).items():
        total += count * np.asarray(_round_rdp(analysis, clients, m, z))
    return total


def _rdp_delta(analysis: str, rdp: np.ndarray, epsilon: float) -> float:
    """δ(ε) from an RDP curve: Abadi et al.'s rule for "paper", else improved."""
    orders = _orders(analysis)
    if analysis == "paper":
        with np.errstate(over="ignore"):
            return float(min(1.0, np.min(np.exp((orders - 1.0) * (rdp - epsilon)))))
    with _quiet():
        return float(rdp_privacy_accountant.compute_delta(orders, rdp, epsilon)[0])


def _rdp_epsilon(analysis: str, rdp: np.ndarray, delta: float) -> float:
    """ε(δ) from an RDP curve: Abadi et al.'s rule for "paper", else improved."""
    if analysis == "paper":
        return rdp_to_dp(_ABADI_ORDERS, rdp, delta=delta, conversion="mironov")
    with _quiet():
        return float(
            rdp_privacy_accountant.compute_epsilon(_orders(analysis), rdp, delta)[0]
        )


def _pld_bound(
    analysis: str,
    clients: int,
    schedule: list[tuple[int, float]],
    *,
    delta: float | None = None,
    epsilon: float | None = None,
) -> Bound:
    """The certified PLD bracket of the rounds (``"sound"`` or ``"paper-pld"``).

    Each round is ``FixedCohort(m, K, Gaussian(z))``, priced by the
    :class:`~dpfl.accounting.accountant.Accountant` under the analysis (the
    symmetrised ``C_{m/K}(G_{2/z})`` for ``"sound"``, the Poisson reading at
    rate ``m/K`` for ``"paper-pld"``) and composed by its certified FFT.
    """
    from dpfl.accounting.accountant import Accountant

    acc = Accountant(analysis)
    for (m, z), count in collections.Counter(schedule).items():
        acc.compose(FixedCohort(m, clients, Gaussian(z)), count)
    if delta is not None:
        return acc.epsilon(delta)
    return acc.delta(float(epsilon))  # type: ignore[arg-type]


def dp_fedavg_delta(
    *,
    epsilon: float,
    clients: int,
    cohort_sizes: Sequence[int] | int,
    noise_multipliers: Sequence[float] | float,
    rounds: int | None = None,
    analysis: str = "sound",
) -> float:
    """δ(ε) of client-level DP-FedAvg after a schedule of rounds.

    Round t samples m_t of the K clients and adds N(0, σ_t² S²) to the sum of
    updates clipped to S (Geyer et al. 2017, Alg. 1; docs/analyses.md).

    Parameters
    ----------
    epsilon : float
        ε >= 0 at which δ is reported (the paper fixes ε = 8).
    clients : int
        Number of clients K >= 1.
    cohort_sizes : int or sequence of int
        m_t per round, or one m for every round.
    noise_multipliers : float or sequence of float
        σ_t per round (noise std in units of S), or one σ for every round.
    rounds : int, optional
        Number of rounds T; required when both schedules are scalars, and must
        agree with their lengths otherwise.
    analysis : {"sound", "sound-rdp", "paper", "paper-rdp", "paper-pld"}, optional
        See the module docstring.  Default "sound".

    Returns
    -------
    float
        δ in [0, 1] (an upper bound for the chosen analysis).

    Raises
    ------
    InvalidParameterError
        If a parameter is outside its domain or the schedule is inconsistent.

    References
    ----------
    Geyer, Klein & Nabi (2017); Abadi et al. (2016), Theorem 2; Mironov (2017);
    Wang, Balle & Kasiviswanathan (2019), Theorem 27; docs/analyses.md
    """
    eps = check_nonnegative("epsilon", epsilon)
    analysis = _check_analysis(analysis)
    k, schedule = _schedule(clients, cohort_sizes, noise_multipliers, rounds)
    if analysis in _RDP:
        return _rdp_delta(analysis, _total_rdp(analysis, k, schedule), eps)
    return float(min(1.0, _pld_bound(analysis, k, schedule, epsilon=eps).upper))


def dp_fedavg_epsilon(
    *,
    delta: float,
    clients: int,
    cohort_sizes: Sequence[int] | int,
    noise_multipliers: Sequence[float] | float,
    rounds: int | None = None,
    analysis: str = "sound",
) -> float:
    """ε(δ) of client-level DP-FedAvg after a schedule of rounds.

    Parameters
    ----------
    delta : float
        Target δ in (0, 1).
    clients : int
        Number of clients K >= 1.
    cohort_sizes : int or sequence of int
        m_t per round, or one m for every round.
    noise_multipliers : float or sequence of float
        σ_t per round, or one σ for every round.
    rounds : int, optional
        Number of rounds T (see :func:`dp_fedavg_delta`).
    analysis : {"sound", "sound-rdp", "paper", "paper-rdp", "paper-pld"}, optional
        See the module docstring.  Default "sound".

    Returns
    -------
    float
        ε >= 0 (an upper bound for the chosen analysis).

    Raises
    ------
    InvalidParameterError
        If a parameter is outside its domain or the schedule is inconsistent.

    References
    ----------
    See :func:`dp_fedavg_delta`.
    """
    dlt = check_delta("delta", delta)
    analysis = _check_analysis(analysis)
    k, schedule = _schedule(clients, cohort_sizes, noise_multipliers, rounds)
    if analysis in _RDP:
        return _rdp_epsilon(analysis, _total_rdp(analysis, k, schedule), dlt)
    return float(_pld_bound(analysis, k, schedule, delta=dlt).upper)


def dp_fedavg_stop_round(
    *,
    epsilon: float,
    threshold: float,
    clients: int,
    cohort_sizes: Sequence[int] | int,
    noise_multipliers: Sequence[float] | float,
    max_rounds: int,
    analysis: str = "sound",
) -> int | None:
    """First round whose release would push δ(ε) above the threshold Q.

    Geyer et al.'s Algorithm 1 asks the accountant for δ at fixed ε before each
    round and stops when δ > Q; this returns the 1-based round t at which δ
    after t rounds first exceeds Q, so training releases t - 1 rounds.

    Parameters
    ----------
    epsilon : float
        Fixed ε >= 0 (the paper uses 8).
    threshold : float
        The δ threshold Q in (0, 1) (paper: 1e-3, 1e-5, 1e-6 for K = 100,
        1000, 10000).
    clients : int
        Number of clients K >= 1.
    cohort_sizes : int or sequence of int
        m_t (length ``max_rounds`` if a sequence).
    noise_multipliers : float or sequence of float
        σ_t (length ``max_rounds`` if a sequence).
    max_rounds : int
        Number of rounds to look ahead, >= 1.
    analysis : {"sound", "sound-rdp", "paper", "paper-rdp", "paper-pld"}, optional
        See the module docstring.  Default "sound".

    Returns
    -------
    int or None
        The stopping round, or None if δ stays <= Q for all ``max_rounds``.

    Raises
    ------
    InvalidParameterError
        If a parameter is outside its domain or the schedule is inconsistent.

    References
    ----------
    Geyer, Klein & Nabi (2017), Algorithm 1; docs/analyses.md
    """
    eps = check_nonnegative("epsilon", epsilon)
    q = check_delta("threshold", threshold)
    analysis = _check_analysis(analysis)
    t_max = check_count("max_rounds", max_rounds, minimum=1)
    k, schedule = _schedule(clients, cohort_sizes, noise_multipliers, t_max)
    if analysis in _RDP:
        cumulative = np.cumsum(
            [np.asarray(_round_rdp(analysis, k, m, z)) for m, z in schedule], axis=0
        )
        for t in range(t_max):
            if _rdp_delta(analysis, cumulative[t], eps) > q:
                return t + 1
        return None

    def exceeds(t: int) -> bool:
        return bool(_pld_bound(analysis, k, schedule[:t], epsilon=eps).upper > q)

    if not exceeds(t_max):
        return None
    lo, hi = 0, t_max  # invariant: not exceeds(lo) (lo = 0 is no release), exceeds(hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if exceeds(mid):
            hi = mid
        else:
            lo = mid
    return hi


# ---------------------------------------------------------------------------
# RDP to DP, Gaussian helpers, LOCKS
# ---------------------------------------------------------------------------
def rdp_to_dp(
    orders: Sequence[float] | np.ndarray,
    rdp: Sequence[float] | np.ndarray,
    *,
    delta: float,
    conversion: str = "mironov",
) -> float:
    """Convert an RDP curve to ε at a given δ.

    ``"mironov"`` (default): ε = min_α [ε_RDP(α) + ln(1/δ)/(α - 1)] (Mironov
    2017, Prop. 3; LOCKS Def. 3.6).  ``"improved"``: Balle et al. (2020),
    Prop. 12, ε = min_α [ε_RDP(α) + ln(1 - 1/α) - (ln δ + ln α)/(α - 1)], the
    conversion dp_accounting uses; never larger.

    Parameters
    ----------
    orders : sequence of float
        RDP orders α > 1 (α = 1 entries are skipped).
    rdp : sequence of float
        ε_RDP(α) >= 0 at those orders (``inf`` allowed).
    delta : float
        Target δ in (0, 1).
    conversion : {"mironov", "improved"}, optional
        Default "mironov".

    Returns
    -------
    float
        ε >= 0 (``inf`` if every order is infinite).

    Raises
    ------
    InvalidParameterError
        If the arrays differ in length, are empty, hold an order < 1 or a
        negative RDP value, or ``conversion`` is unknown.

    References
    ----------
    Mironov (2017), Proposition 3; Balle et al. (2020), "Hypothesis testing
    interpretations and Rényi differential privacy", Proposition 12.
    """
    dlt = check_delta("delta", delta)
    a = np.asarray(orders, dtype=float)
    r = np.asarray(rdp, dtype=float)
    if a.ndim != 1 or a.shape != r.shape or a.size == 0:
        raise InvalidParameterError(
            f"orders and rdp must be non-empty 1-D arrays of equal length; got "
            f"shapes {a.shape} and {r.shape}"
        )
    if np.any(np.isnan(a)) or np.any(a < 1):
        raise InvalidParameterError(f"orders must be >= 1; got {a.tolist()!r}")
    if np.any(np.isnan(r)) or np.any(r < 0):
        raise InvalidParameterError(f"rdp values must be >= 0; got {r.tolist()!r}")
    keep = a > 1
    a, r = a[keep], r[keep]
    if a.size == 0:
        return math.inf
    if conversion == "mironov":
        eps = r + math.log(1.0 / dlt) / (a - 1.0)
    elif conversion == "improved":
        eps = r + np.log1p(-1.0 / a) - (math.log(dlt) + np.log(a)) / (a - 1.0)
    else:
        raise InvalidParameterError(
            f"conversion must be 'mironov' or 'improved'; got {conversion!r}"
        )
    return float(max(0.0, np.min(eps)))


def _sensitivity_factor(neighbouring: str) -> float:
    if neighbouring == "zero-out":
        return 1.0
    if neighbouring == "replace-one":
        return 2.0
    raise InvalidParameterError(
        f"neighbouring must be 'zero-out' or 'replace-one'; got {neighbouring!r}"
    )


def locks_server_view(
    *,
    norm_noise_multiplier: float,
    update_noise_multiplier: float,
    norm_rounds: int,
    update_rounds: int,
    delta: float,
    neighbouring: str = "zero-out",
) -> dict[str, Any]:
    """LOCKS, client-level guarantee of one client's realised releases.

    The server sees which clients sent what, so there is no amplification: a
    client that released N1 noisy norms (noise σ_n C on a query in [0, C]) and
    N2 noisy updates (noise σ_g C, sensitivity Δ_g = C under zero-out, i.e.
    the client's data replaced by data with a zero update, 2C under
    replace-one) is exactly μ-GDP with
    μ = sqrt(N1/σ_n² + N2 (Δ_g/C)²/σ_g²), i.e. ρ-zCDP with ρ = μ²/2.

    Parameters
    ----------
    norm_noise_multiplier : float
        σ_n > 0.
    update_noise_multiplier : float
        σ_g > 0.
    norm_rounds : int
        N1 >= 0, rounds in which the client was in S1 (realised, not expected).
    update_rounds : int
        N2 >= 0, rounds in which it was in S2 (N2 <= N1).
    delta : float
        Target δ in (0, 1).
    neighbouring : {"zero-out", "replace-one"}, optional
        Neighbouring relation for a client.  Default "zero-out".

    Returns
    -------
    dict
        ``mu``; ``epsilon`` (exact, from the GDP curve); ``rho``;
        ``epsilon_rdp`` (ρ + 2 sqrt(ρ ln 1/δ), LOCKS's conversion at the
        optimal continuous order); ``epsilon_rdp_numeric`` (dp_accounting's
        RDP for the composed Gaussians, converted by :func:`rdp_to_dp` with
        Mironov's formula on the order grid); ``epsilon_rdp_improved`` (same RDP,
        improved conversion); ``delta`` and the guarantee's terms.

    Raises
    ------
    InvalidParameterError
        If a parameter is outside its domain.

    References
    ----------
    Dong, Roth & Su (2022), Corollary 3.3; Mironov (2017), Proposition 3;
    Bun & Steinke (2016); docs/analyses.md.
    """
    sn = check_positive("norm_noise_multiplier", norm_noise_multiplier)
    sg = check_positive("update_noise_multiplier", update_noise_multiplier)
    n1 = check_count("norm_rounds", norm_rounds, minimum=0)
    n2 = check_count("update_rounds", update_rounds, minimum=0)
    if n2 > n1:
        raise InvalidParameterError(
            f"update_rounds must be <= norm_rounds (S2 is a subset of S1); got "
            f"{n2} > {n1}"
        )
    dlt = check_delta("delta", delta)
    factor = _sensitivity_factor(neighbouring)
    mu = math.sqrt(n1 / sn**2 + n2 * factor**2 / sg**2)
    rho = mu * mu / 2.0
    acc = rdp_privacy_accountant.RdpAccountant(list(_ORDERS))
    with _quiet():
        if n1:
            acc.compose(dp_event.GaussianDpEvent(sn), n1)
        if n2:
            acc.compose(dp_event.GaussianDpEvent(sg / factor), n2)
    rdp = acc.rdp
    return {
        "mu": mu,
        "epsilon": gaussian.gdp_epsilon(dlt, mu=mu),
        "rho": rho,
        "epsilon_rdp": rho + 2.0 * math.sqrt(rho * math.log(1.0 / dlt)),
        "epsilon_rdp_numeric": rdp_to_dp(_ORDERS, rdp, delta=dlt),
        "epsilon_rdp_improved": rdp_to_dp(
            _ORDERS, rdp, delta=dlt, conversion="improved"
        ),
        "delta": dlt,
        "unit": "client",
        "neighbouring": neighbouring,
        "adversary": "the server (sees who sent what); a statement about a run in "
        "which the client released N1 norms and N2 updates",
        "analysis": "server",
        "status": "proven",
    }


# -- the price of a TwoStage (LOCKS) round (registered with the Accountant) ----
@pricing.canonical.register
def _(event: ev.TwoStage) -> ev.Event:
    # The price depends on q1, the largest p2 and the two noise levels only.
    return dataclasses.replace(event, second_stage_size=1)


@pricing.prices(ev.TwoStage)
def _price_two_stage(
    event: ev.TwoStage, *, analysis: str, discretization: float
) -> pricing.PldPair:
    # Server view (and observer view, bounded by it): w.p. q1 the noisy norm,
    # and w.p. at most q1 * max p2 also the noisy update; who took part is seen.
    return pricing.public_mixture(
        pricing.exclusive(costs.participant_costs(event)), "exact", discretization
    )
