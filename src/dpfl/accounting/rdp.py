"""Rényi-DP (moments accountant) analyses: client-level DP-FedAvg and LOCKS.

dp_accounting is the engine: its :class:`RdpAccountant` for RDP (with the
improved RDP-to-DP conversion of Balle et al. 2020 unless stated otherwise)
and its :class:`PLDAccountant` for tight privacy-loss distributions.  Its
absl log messages and Python warnings are silenced here; orders it cannot
evaluate are dropped by it, which only makes the bound more conservative.

DP-FedAvg (Geyer, Klein & Nabi 2017; SPEC §4) analyses, by ``analysis``:

``"paper"``
    Moments accountant with a Poisson reading of the cohort, q_t = m_t/K,
    add/remove of one client (as the paper and TF-Privacy do).  Algorithm 1
    samples a *fixed-size* cohort, so this is not a valid bound for the
    algorithm as written (SPEC §4.3 item 1); it is valid if clients are
    Poisson-sampled with rate m_t/K.
``"pld"``
    The same Poisson reading with a tight PLD accountant.
``"sound"``
    Fixed-size cohort sampled without replacement, replace-one of a client:
    the sum's sensitivity is 2S, so the noise multiplier is σ/2, priced with
    the RDP bound of Wang, Balle & Kasiviswanathan (2019).
``"sound-pld"``
    The same scheme priced exactly: each round is C_{m/K}(G_{2/σ}) (Dong, Roth
    & Su 2022, WOR subsampling under replace-one), symmetrised before
    composition (SPEC §3.3).

LOCKS (SPEC §2.2): :func:`locks_server_view` (exact Gaussian composition
against the server, which sees who sent what) and :func:`locks_observer_view`
(amplified, for parties that see the model only).
"""

from __future__ import annotations

import collections
import functools
import math
from collections.abc import Sequence
from typing import Any, cast

import numpy as np
from dp_accounting import dp_event
from dp_accounting.pld import pld_privacy_accountant
from dp_accounting.privacy_accountant import NeighboringRelation
from dp_accounting.rdp import rdp_privacy_accountant
from scipy import optimize

from dpfl.accounting import fdp, gaussian
from dpfl.accounting._checks import (
    check_count,
    check_delta,
    check_nonnegative,
    check_positive,
    check_probability,
)
from dpfl.accounting._quiet import quiet as _quiet
from dpfl.errors import InvalidParameterError

__all__ = [
    "ANALYSES",
    "calibrate_dp_fedavg",
    "dp_fedavg_delta",
    "dp_fedavg_epsilon",
    "dp_fedavg_stop_round",
    "locks_observer_view",
    "locks_server_view",
    "rdp_to_dp",
]

#: Analyses accepted by the DP-FedAvg functions.
ANALYSES = ("paper", "pld", "sound", "sound-pld")

#: RDP orders: dp_accounting's defaults, plus a finer grid of integers.
_ORDERS = np.array(
    [1 + x / 10.0 for x in range(1, 100)]
    + list(range(11, 64))
    + [80, 96, 128, 192, 256, 384, 512, 768, 1024]
)

_PLD_INTERVAL = 1e-4


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
    """RDP of one round at :data:`_ORDERS` (cached per distinct round)."""
    if analysis == "paper":
        acc = rdp_privacy_accountant.RdpAccountant(list(_ORDERS))
        event: dp_event.DpEvent = dp_event.PoissonSampledDpEvent(
            cohort / clients, dp_event.GaussianDpEvent(noise)
        )
    else:  # "sound": WOR, replace-one, sensitivity 2S -> multiplier σ/2
        acc = rdp_privacy_accountant.RdpAccountant(
            list(_ORDERS), NeighboringRelation.REPLACE_ONE
        )
        event = dp_event.SampledWithoutReplacementDpEvent(
            clients, cohort, dp_event.GaussianDpEvent(noise / 2.0)
        )
    with _quiet():
        acc.compose(event)
    return tuple(float(v) for v in acc.rdp)


def _total_rdp(
    analysis: str, clients: int, schedule: list[tuple[int, float]]
) -> np.ndarray:
    total = np.zeros_like(_ORDERS, dtype=float)
    for (m, z), count in collections.Counter(schedule).items():
        total += count * np.asarray(_round_rdp(analysis, clients, m, z))
    return total


@functools.lru_cache(maxsize=256)
def _round_pmf(analysis: str, clients: int, cohort: int, noise: float) -> Any:
    """Pessimistic PLD pmf of one round for the PLD analyses."""
    if analysis == "pld":
        from dp_accounting.pld import privacy_loss_distribution as pld_lib

        with _quiet():
            pld = pld_lib.from_gaussian_mechanism(
                noise,
                sampling_prob=cohort / clients,
                value_discretization_interval=_PLD_INTERVAL,
                use_connect_dots=True,
            )
        return pld
    # Fixed cohort, replace-one client: C_{m/K}(G_{2/sigma}), symmetrised.
    return fdp.subsampled_gaussian_pld(
        noise_multiplier=noise / 2.0,
        sampling_probability=cohort / clients,
        value_discretization=_PLD_INTERVAL,
    )


def _composed_pld(
    analysis: str, clients: int, schedule: list[tuple[int, float]]
) -> Any:
    composed = None
    with _quiet():
        for (m, z), count in collections.Counter(schedule).items():
            one = _round_pmf(analysis, clients, m, z)
            part = one.self_compose(count) if count > 1 else one
            composed = part if composed is None else composed.compose(part)
    return composed


def dp_fedavg_delta(
    *,
    epsilon: float,
    clients: int,
    cohort_sizes: Sequence[int] | int,
    noise_multipliers: Sequence[float] | float,
    rounds: int | None = None,
    analysis: str = "paper",
) -> float:
    """δ(ε) of client-level DP-FedAvg after a schedule of rounds.

    Round t samples m_t of the K clients and adds N(0, σ_t² S²) to the sum of
    updates clipped to S (Geyer et al. 2017, Alg. 1; SPEC §4).

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
    analysis : {"paper", "pld", "sound", "sound-pld"}, optional
        See the module docstring.  Default "paper".

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
    Wang, Balle & Kasiviswanathan (2019), Theorem 27; SPEC.md §4.2-4.3.
    """
    eps = check_nonnegative("epsilon", epsilon)
    analysis = _check_analysis(analysis)
    k, schedule = _schedule(clients, cohort_sizes, noise_multipliers, rounds)
    if analysis in ("paper", "sound"):
        with _quiet():
            return float(
                rdp_privacy_accountant.compute_delta(
                    _ORDERS, _total_rdp(analysis, k, schedule), eps
                )[0]
            )
    with _quiet():
        return float(
            min(1.0, _composed_pld(analysis, k, schedule).get_delta_for_epsilon(eps))
        )


def dp_fedavg_epsilon(
    *,
    delta: float,
    clients: int,
    cohort_sizes: Sequence[int] | int,
    noise_multipliers: Sequence[float] | float,
    rounds: int | None = None,
    analysis: str = "paper",
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
    analysis : {"paper", "pld", "sound", "sound-pld"}, optional
        See the module docstring.  Default "paper".

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
    if analysis in ("paper", "sound"):
        with _quiet():
            return float(
                rdp_privacy_accountant.compute_epsilon(
                    _ORDERS, _total_rdp(analysis, k, schedule), dlt
                )[0]
            )
    with _quiet():
        return float(_composed_pld(analysis, k, schedule).get_epsilon_for_delta(dlt))


def dp_fedavg_stop_round(
    *,
    epsilon: float,
    threshold: float,
    clients: int,
    cohort_sizes: Sequence[int] | int,
    noise_multipliers: Sequence[float] | float,
    max_rounds: int,
    analysis: str = "paper",
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
    analysis : {"paper", "pld", "sound", "sound-pld"}, optional
        Default "paper".

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
    Geyer, Klein & Nabi (2017), Algorithm 1; SPEC.md §4.1-4.2.
    """
    eps = check_nonnegative("epsilon", epsilon)
    q = check_delta("threshold", threshold)
    analysis = _check_analysis(analysis)
    t_max = check_count("max_rounds", max_rounds, minimum=1)
    k, schedule = _schedule(clients, cohort_sizes, noise_multipliers, t_max)
    if analysis in ("paper", "sound"):
        cumulative = np.cumsum(
            [np.asarray(_round_rdp(analysis, k, m, z)) for m, z in schedule], axis=0
        )
        with _quiet():
            for t in range(t_max):
                d = rdp_privacy_accountant.compute_delta(_ORDERS, cumulative[t], eps)[0]
                if d > q:
                    return t + 1
        return None

    def exceeds(t: int) -> bool:
        with _quiet():
            return bool(
                _composed_pld(analysis, k, schedule[:t]).get_delta_for_epsilon(eps) > q
            )

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


def calibrate_dp_fedavg(
    *,
    epsilon: float,
    delta: float,
    clients: int,
    cohort: int,
    rounds: int,
    analysis: str = "paper",
    tolerance: float = 1e-4,
) -> float:
    """Smallest noise multiplier σ meeting (ε, δ) after ``rounds`` rounds.

    Parameters
    ----------
    epsilon : float
        Target ε > 0.
    delta : float
        Target δ in (0, 1).
    clients : int
        Number of clients K >= 1.
    cohort : int
        Cohort size m, 1 <= m <= K.
    rounds : int
        Number of rounds T >= 1.
    analysis : {"paper", "pld", "sound", "sound-pld"}, optional
        Default "paper".
    tolerance : float, optional
        Absolute tolerance on σ.  Default 1e-4.

    Returns
    -------
    float
        σ such that the analysis certifies (ε, δ); it exceeds the exact
        threshold by at most ``tolerance``.

    Raises
    ------
    InvalidParameterError
        If a parameter is outside its domain, or no σ up to 1e6 suffices.

    Notes
    -----
    Geyer's example (K = 100, m = 50, 11 rounds, ε = 8, δ = 1e-3) needs
    σ = 1.0810 ("paper"), 0.9835 ("pld"), 3.3961 ("sound"); SPEC §4.2.

    References
    ----------
    See :func:`dp_fedavg_delta`.
    """
    eps = check_positive("epsilon", epsilon)
    dlt = check_delta("delta", delta)
    tol = check_positive("tolerance", tolerance)
    check_count("rounds", rounds, minimum=1)

    def excess(z: float) -> float:
        return (
            dp_fedavg_epsilon(
                delta=dlt,
                clients=clients,
                cohort_sizes=cohort,
                noise_multipliers=z,
                rounds=rounds,
                analysis=analysis,
            )
            - eps
        )

    hi = 1.0
    while excess(hi) > 0:
        hi *= 2.0
        if hi > 1e6:
            raise InvalidParameterError(
                f"no noise multiplier up to 1e6 reaches epsilon={epsilon!r}, "
                f"delta={delta!r}"
            )
    lo = hi / 2.0
    while excess(lo) <= 0 and lo > 1e-3:
        hi, lo = lo, lo / 2.0
    root = optimize.brentq(excess, lo, hi, xtol=tol / 4.0)
    z = float(root)
    while excess(z) > 0:  # return a σ on the certified side of the root
        z += tol / 4.0
    return z


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
    if neighbouring == "add/remove":
        return 1.0
    if neighbouring == "replace-one":
        return 2.0
    raise InvalidParameterError(
        f"neighbouring must be 'add/remove' or 'replace-one'; got {neighbouring!r}"
    )


def locks_server_view(
    *,
    norm_noise_multiplier: float,
    update_noise_multiplier: float,
    norm_rounds: int,
    update_rounds: int,
    delta: float,
    neighbouring: str = "add/remove",
) -> dict[str, Any]:
    """LOCKS, client-level guarantee against the server (SPEC §2.2).

    The server sees which clients sent what, so there is no amplification: a
    client that released N1 noisy norms (noise σ_n C on a query in [0, C]) and
    N2 noisy updates (noise σ_g C, sensitivity Δ_g = C under add/remove, 2C
    under replace-one) is exactly μ-GDP with
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
    neighbouring : {"add/remove", "replace-one"}, optional
        Neighbouring relation for a client.  Default "add/remove".

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
    Bun & Steinke (2016); SPEC.md §2.2.
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
        "adversary": "the server (sees who sent what)",
        "analysis": "sound (exact Gaussian composition)",
    }


def locks_observer_view(
    *,
    q1: float,
    max_p2: float,
    norm_noise_multiplier: float,
    update_noise_multiplier: float,
    rounds: int,
    delta: float,
) -> dict[str, Any]:
    """LOCKS, amplified client-level guarantee for model observers (SPEC §2.2).

    Parties that see the released models but not S1/S2 get amplification:
    SPEC §2.2 prices the norm release as a Poisson(q1)-subsampled Gaussian with
    multiplier σ_n and the update release as Poisson(q1 · max p2)-subsampled
    with σ_g (add/remove of a client, Δ_g = C), each composed over the rounds.
    Pricing the two releases of a round as *separately* subsampled assumes
    their inclusion events can be treated one after the other; since S2 ⊆ S1
    they are correlated, so a second, more conservative figure is reported:
    ``epsilon_pld_joint`` treats the norm and the update of a round as one
    Gaussian release of multiplier (σ_n⁻² + σ_g⁻²)^(-1/2) subsampled at q1
    (no p2 amplification), which is valid whatever that correlation: the
    inner mechanism on a sampled client releases at most both Gaussians
    (withholding the update with probability 1 - p2 is post-processing), and
    Poisson subsampling of a mechanism dominated by a Gaussian is dominated by
    the subsampled Gaussian.  The standard adaptive-composition theorem does
    not cover the separate figures, because the second stage's inclusion is
    not fresh randomness given the first stage's (see notes/rdp.md).

    Parameters
    ----------
    q1 : float
        First-stage inclusion probability in (0, 1].
    max_p2 : float
        Largest second-stage probability max_k p2_k in (0, 1].
    norm_noise_multiplier : float
        σ_n > 0.
    update_noise_multiplier : float
        σ_g > 0.
    rounds : int
        Number of rounds T >= 1.
    delta : float
        Target δ in (0, 1).

    Returns
    -------
    dict
        ``epsilon`` (= ``epsilon_pld_joint``, the figure dpfl stands behind);
        ``epsilon_rdp`` and ``epsilon_pld`` (SPEC §2.2's separate composition,
        via dp_accounting's RDP and PLD accountants); ``epsilon_pld_joint``;
        ``delta`` and the guarantee's terms.

    Raises
    ------
    InvalidParameterError
        If a parameter is outside its domain.

    References
    ----------
    Mironov, Talwar & Zhang (2019), "Rényi DP of the sampled Gaussian
    mechanism"; Doroshenko et al. (2022); SPEC.md §2.2-2.3.
    """
    p1 = check_probability("q1", q1)
    p2 = check_probability("max_p2", max_p2)
    sn = check_positive("norm_noise_multiplier", norm_noise_multiplier)
    sg = check_positive("update_noise_multiplier", update_noise_multiplier)
    t = check_count("rounds", rounds, minimum=1)
    dlt = check_delta("delta", delta)
    norm_event = dp_event.PoissonSampledDpEvent(p1, dp_event.GaussianDpEvent(sn))
    update_event = dp_event.PoissonSampledDpEvent(p1 * p2, dp_event.GaussianDpEvent(sg))
    joint_z = 1.0 / math.sqrt(sn**-2 + sg**-2)
    joint_event = dp_event.PoissonSampledDpEvent(p1, dp_event.GaussianDpEvent(joint_z))
    with _quiet():
        rdp_acc = rdp_privacy_accountant.RdpAccountant(list(_ORDERS))
        rdp_acc.compose(norm_event, t).compose(update_event, t)
        pld_acc = pld_privacy_accountant.PLDAccountant(
            value_discretization_interval=_PLD_INTERVAL
        )
        pld_acc.compose(norm_event, t).compose(update_event, t)
        joint_acc = pld_privacy_accountant.PLDAccountant(
            value_discretization_interval=_PLD_INTERVAL
        )
        joint_acc.compose(joint_event, t)
        joint = float(joint_acc.get_epsilon(dlt))
        out: dict[str, Any] = {
            "epsilon": joint,
            "epsilon_rdp": float(rdp_acc.get_epsilon(dlt)),
            "epsilon_pld": float(pld_acc.get_epsilon(dlt)),
            "epsilon_pld_joint": joint,
        }
    out.update(
        {
            "delta": dlt,
            "unit": "client",
            "neighbouring": "add/remove",
            "adversary": "observers of the released models (not S1, S2 or norms)",
            "analysis": "amplified (Poisson-subsampled Gaussian, SPEC §2.2)",
        }
    )
    return out
