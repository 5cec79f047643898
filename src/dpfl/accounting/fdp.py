"""Trade-off functions and PriFedSync's weak / strong federated f-DP.

This module prices the record-level guarantee of PriFedSync (Zheng, Chen,
Long and Su, AISTATS 2021; docs/analyses.md): each participating client ``j`` runs
``K`` steps of NoisySGD per round on a uniformly random batch of ``B`` of its
``n`` records, so that one step is the subsampled Gaussian trade-off
``C_{B/n}(G_{1/σ})`` and the whole run is ``C_{B/n}(G_{1/σ})^{⊗KR}``.

σ convention (docs/analyses.md)
-------------------------------------
Here ``noise_multiplier`` is the **paper's** σ: the noise added to the sum of
clipped per-record gradients has standard deviation ``2Cσ``, and neighbouring
data sets differ by *replacing* one record (sensitivity ``2C``), so one
un-subsampled step is exactly ``G_{1/σ}``. Opacus' ``noise_multiplier`` (std
``σ_O C``) is ``σ_O = 2σ`` in this convention: feeding Opacus' value as σ
overstates privacy, since the reported μ is then half the true one.

Computation (docs/analyses.md)
-----------------------
``C_p(G_μ)`` is the symmetrised trade-off of the Poisson-subsampled Gaussian:
``δ_C(ε) = max(δ_add(ε), δ_rem(ε))`` for every real ε. dpfl symmetrises
*first* and then composes a single symmetric privacy-loss distribution (PLD):
composing the add and remove PLDs separately (what
``from_gaussian_mechanism(..., sampling_prob=p).self_compose(T)`` does) gives
the Poisson/add-remove answer, which is smaller and is **not** a bound for
``C_p(G)^{⊗T}`` (10.82 instead of 13.88 for Table-1 row 1).

References
----------
.. [ZCLS21] Q. Zheng, S. Chen, Q. Long and W. J. Su, "Federated f-differential
   privacy", AISTATS 2021, Theorems 1-2, Appendix D.
.. [DRS] J. Dong, A. Roth and W. J. Su, "Gaussian differential privacy",
   JRSS-B 2022, Theorem 4.2 (subsampling), Corollary 5.4 (CLT).
.. [DGKKM22] V. Doroshenko, B. Ghazi, P. Kamath, R. Kumar and P. Manurangsi,
   "Connect the dots: tighter discrete approximations of privacy loss
   distributions", PETS 2022, Algorithm 1.
"""

from __future__ import annotations

import functools
import math
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from dp_accounting.pld import pld_pmf, privacy_loss_mechanism
from dp_accounting.pld.privacy_loss_distribution import PrivacyLossDistribution
from numpy.typing import ArrayLike
from scipy import optimize, special

from dpfl._validate import (
    check_count,
    check_delta,
    check_nonnegative,
    check_positive,
    check_probability,
)
from dpfl.accounting import events as ev
from dpfl.accounting import pricing
from dpfl.accounting.bounds import Bound, Guarantee
from dpfl.accounting.gaussian import (
    _check_alpha,
    _finite,
    gdp_epsilon,
    gdp_mu,
)
from dpfl.errors import InvalidParameterError, UnsupportedEventError

__all__ = [
    "clt_mu",
    "delta_from_tradeoff",
    "exact_delta",
    "exact_epsilon",
    "identity_tradeoff",
    "mu_effective",
    "strong_federated",
    "subsampled_gaussian_delta",
    "subsampled_gaussian_pld",
    "subsampled_tradeoff",
    "tradeoff_from_deltas",
    "weak_federated",
]

_SQRT2 = math.sqrt(2.0)
#: Tail mass dp_accounting may move to +∞ (pessimistic) or drop, per composition.
_TAIL_MASS = 1e-15


# ----------------------------------------------------------------------------
# trade-off functions
# ----------------------------------------------------------------------------
def identity_tradeoff(alpha: ArrayLike) -> np.ndarray:
    """Return ``Id(α) = 1 − α``, the trade-off of perfect privacy.

    Parameters
    ----------
    alpha : array_like
        Type-I errors in [0, 1].

    Returns
    -------
    numpy.ndarray
        ``1 − α``.

    Raises
    ------
    InvalidParameterError
        If ``alpha`` leaves [0, 1].

    References
    ----------
    .. [1] Dong, Roth and Su, Definition 2.1.
    """
    return 1.0 - _check_alpha(alpha)


def _check_p(sampling_probability: object) -> float:
    return check_probability("sampling_probability", sampling_probability)


def _fp(t: np.ndarray, mu: float, p: float) -> np.ndarray:
    """``f_p(t) = p G_μ(t) + (1 − p)(1 − t)`` (decreasing in t)."""
    out = p * special.ndtr(-special.ndtri(t) - mu) + (1.0 - p) * (1.0 - t)
    return np.asarray(out, dtype=float)


def _fp_inverse(a: np.ndarray, mu: float, p: float) -> np.ndarray:
    """``f_p^{-1}(a) = inf{t : f_p(t) <= a}`` by vectorised bisection."""
    lo = np.zeros_like(a)
    hi = np.ones_like(a)
    for _ in range(80):  # 2^-80 < 1e-24: below float resolution on [0, 1]
        mid = 0.5 * (lo + hi)
        above = _fp(mid, mu, p) > a
        lo = np.where(above, mid, lo)
        hi = np.where(above, hi, mid)
    return hi


def subsampled_tradeoff(
    alpha: ArrayLike, *, mu: float, sampling_probability: float
) -> np.ndarray:
    """Return ``C_p(G_μ)(α)``, the subsampled Gaussian trade-off (closed form).

    With ``x* = Φ(−μ/2)`` and ``f_p = p G_μ + (1 − p) Id``::

        C_p(G_μ)(α) = f_p(α)                                 α <= x*
                    = (1+p)Φ(−μ/2) + (1−p)Φ(μ/2) − α          x* <= α <= f_p(x*)
                    = f_p^{-1}(α)                            α >= f_p(x*)

    the lower convex envelope of ``min(f_p, f_p^{-1})``; the middle piece is
    the slope −1 segment that joins the two. ``f_p^{-1}`` has no closed form
    and is inverted by bisection to ~1e-16.

    Parameters
    ----------
    alpha : array_like
        Type-I errors in [0, 1].
    mu : float
        GDP parameter of the un-subsampled step (>= 0).
    sampling_probability : float
        ``p = B/n`` in (0, 1].

    Returns
    -------
    numpy.ndarray
        Type-II errors, the shape of ``alpha``.

    Raises
    ------
    InvalidParameterError
        If a parameter is outside its domain.

    References
    ----------
    .. [1] Dong, Roth and Su, Theorem 4.2 (subsampling operator ``C_p``).
    .. [2] docs/analyses.md (closed form for ``f = G_μ``).
    """
    a = _check_alpha(alpha)
    m = check_nonnegative("mu", mu)
    p = _check_p(sampling_probability)
    x_star = special.ndtr(-m / 2.0)
    f_x_star = p * x_star + (1.0 - p) * special.ndtr(m / 2.0)
    out = np.empty_like(a)
    left = a <= x_star
    right = a >= f_x_star
    mid = ~left & ~right
    out[left] = _fp(a[left], m, p)
    out[mid] = (1.0 + p) * x_star + (1.0 - p) * special.ndtr(m / 2.0) - a[mid]
    out[right] = _fp_inverse(a[right], m, p)
    return np.asarray(np.clip(out, 0.0, 1.0), dtype=float)


def tradeoff_from_deltas(
    alpha: ArrayLike,
    delta_fn_or_pld: Callable[[np.ndarray], ArrayLike] | PrivacyLossDistribution,
    *,
    epsilons: ArrayLike | None = None,
) -> np.ndarray:
    """Return ``f(α) = sup_ε max(0, 1 − δ(ε) − e^ε α)`` from a privacy profile.

    Parameters
    ----------
    alpha : array_like
        Type-I errors in [0, 1].
    delta_fn_or_pld : callable or PrivacyLossDistribution
        Either a function ``δ(ε)`` accepting a numpy array of real ε, or a
        dp_accounting PLD (its ``get_delta_for_epsilon``, the maximum over
        the add and remove directions, is used).
    epsilons : array_like, optional
        The ε over which the supremum is taken. Default: for a PLD, every
        point of its support, which makes the result *exact* for that PLD
        (its δ is piecewise linear in ``e^ε`` with kinks at the support);
        for a function, ``ε ∈ [−15, 15]`` in steps of ``1e-3``.

    Returns
    -------
    numpy.ndarray
        The trade-off function at ``alpha``. A supremum over a finite grid can
        only be lower than the true one, so the result is conservative (less
        private) when ``δ`` is itself an upper bound.

    Raises
    ------
    InvalidParameterError
        If ``alpha`` leaves [0, 1] or ``δ`` returns values outside [0, 1].

    References
    ----------
    .. [1] Dong, Roth and Su, Proposition 2.12; docs/analyses.md.
    """
    a = _check_alpha(alpha)
    delta_fn: Callable[[np.ndarray], np.ndarray]
    if isinstance(delta_fn_or_pld, PrivacyLossDistribution):
        pld = delta_fn_or_pld
        eps = _pld_support(pld) if epsilons is None else np.asarray(epsilons, float)

        def pld_delta(e: np.ndarray) -> np.ndarray:
            return np.asarray(pld.get_delta_for_epsilon(e), dtype=float)

        delta_fn = pld_delta
    else:
        delta_fn = _as_vector_fn(delta_fn_or_pld)
        eps = (
            np.arange(-15000, 15001) * 1e-3
            if epsilons is None
            else np.asarray(epsilons, float)
        )
    eps = np.unique(np.append(eps[np.isfinite(eps)], 0.0))
    deltas = np.asarray(delta_fn(eps), dtype=float)
    if np.any(np.isnan(deltas)) or np.any(deltas < -1e-12) or np.any(deltas > 1):
        raise InvalidParameterError("delta(epsilon) must return values in [0, 1]")
    flat = a.ravel()
    out = np.zeros_like(flat)
    base = 1.0 - deltas
    exp_eps = np.exp(eps)
    chunk = max(1, 2_000_000 // eps.size)
    for start in range(0, flat.size, chunk):
        block = flat[start : start + chunk]
        vals = base[None, :] - exp_eps[None, :] * block[:, None]
        out[start : start + chunk] = np.max(vals, axis=1)
    return np.clip(out, 0.0, 1.0).reshape(a.shape)


def delta_from_tradeoff(epsilon: float, f: Callable[[np.ndarray], ArrayLike]) -> float:
    """Return ``δ(ε) = 1 + f*(−e^ε) = sup_α [1 − f(α) − e^ε α]``.

    Parameters
    ----------
    epsilon : float
        Any finite real ε.
    f : callable
        A trade-off function (convex, non-increasing on [0, 1]) accepting a
        numpy array of α, e.g. ``functools.partial(gaussian_tradeoff, mu=1)``.

    Returns
    -------
    float
        δ(ε) >= 0. The supremum is bracketed on a grid (log-spaced down to
        ``α = 1e-30``) and refined by bounded Brent search, which is exact up
        to ~1e-12 because the objective is concave in α.

    Raises
    ------
    InvalidParameterError
        If ``epsilon`` is not finite.

    References
    ----------
    .. [1] Dong, Roth and Su, Proposition 2.12.
    """
    eps = _finite("epsilon", epsilon)
    fn = _as_vector_fn(f)
    t = math.exp(eps)
    grid = np.unique(
        np.concatenate(([0.0], np.logspace(-30, 0, 3001), np.linspace(0, 1, 2001)))
    )
    vals = 1.0 - np.asarray(fn(grid), dtype=float) - t * grid
    i = int(np.argmax(vals))
    best = float(vals[i])
    lo = grid[max(i - 1, 0)]
    hi = grid[min(i + 1, grid.size - 1)]
    if hi > lo:
        res = optimize.minimize_scalar(
            lambda x: -(1.0 - float(np.asarray(fn(np.array([x])))[0]) - t * x),
            bounds=(lo, hi),
            method="bounded",
            options={"xatol": max((hi - lo) * 1e-10, 1e-300)},
        )
        best = max(best, -float(res.fun))
    return max(0.0, best)


# ----------------------------------------------------------------------------
# CLT μ of Theorem 2
# ----------------------------------------------------------------------------
def clt_mu(
    *,
    noise_multiplier: float,
    batch_size: int,
    records_per_client: int,
    local_steps: int,
    rounds: int,
) -> float:
    """Return the CLT ``μ`` of PriFedSync's Theorem 2 (an approximation).

    ``μ = √2 · c · sqrt(e^{1/σ²} Φ(1.5/σ) + 3 Φ(−0.5/σ) − 2)`` with
    ``c = (B/n) sqrt(K R)`` (Appendix D and all of the paper's tables; the
    main text's ``sqrt(2c)`` is a typo, docs/analyses.md).

    Parameters
    ----------
    noise_multiplier : float
        The paper's σ (> 0): noise std on the clipped sum is ``2Cσ`` and the
        neighbouring relation is replace-one, so one step is ``G_{1/σ}``.
    batch_size : int
        ``B`` records per local step (1 <= B <= n).
    records_per_client : int
        ``n`` records held by the client.
    local_steps : int
        ``K`` local steps per round (>= 1).
    rounds : int
        ``R`` synchronisation rounds (>= 1).

    Returns
    -------
    float
        The limit ``μ`` of ``C_{B/n}(G_{1/σ})^{⊗KR}``. It is **not** a bound:
        use :func:`exact_epsilon` for a certified (ε, δ).

    Raises
    ------
    InvalidParameterError
        If a parameter is outside its domain.

    References
    ----------
    .. [1] Zheng et al. 2021, Theorem 2 and Appendix D (eq. D.2).
    .. [2] Dong, Roth and Su, Corollary 5.4.
    """
    sigma, p, steps = _check_client(
        noise_multiplier, batch_size, records_per_client, local_steps, rounds
    )
    inv = 1.0 / sigma
    # e^{1/σ²} Φ(1.5/σ) in log space (σ small would overflow e^{1/σ²})
    h = math.exp(inv * inv + special.log_ndtr(1.5 * inv)) + 3.0 * special.ndtr(
        -0.5 * inv
    )
    h -= 2.0
    return _SQRT2 * p * math.sqrt(steps) * math.sqrt(max(h, 0.0))


def _check_client(
    noise_multiplier: object,
    batch_size: object,
    records_per_client: object,
    local_steps: object,
    rounds: object,
) -> tuple[float, float, int]:
    sigma = check_positive("noise_multiplier", noise_multiplier)
    b = check_count("batch_size", batch_size, minimum=1)
    n = check_count("records_per_client", records_per_client, minimum=1)
    k = check_count("local_steps", local_steps, minimum=1)
    r = check_count("rounds", rounds, minimum=1)
    if b > n:
        raise InvalidParameterError(
            f"batch_size must be <= records_per_client ({n}); got {batch_size!r}"
        )
    return sigma, b / n, k * r


# ----------------------------------------------------------------------------
# subsampled Gaussian: closed-form privacy profiles and PLDs
# ----------------------------------------------------------------------------
def _log_expm1_plus(eps: np.ndarray, p: float) -> np.ndarray:
    """``ln(e^ε − 1 + p)`` for ``ε > ln(1 − p)``, without overflow."""
    out = np.empty_like(eps)
    pos = eps > 0
    out[pos] = eps[pos] + np.log1p(-(1.0 - p) * np.exp(-eps[pos]))
    out[~pos] = np.log(np.expm1(eps[~pos]) + p)
    return out


def _delta_remove(eps: np.ndarray, mu: float, p: float) -> np.ndarray:
    """δ of ``((1−p)N(0,1) + pN(μ,1), N(0,1))``; docs/analyses.md."""
    out = -np.expm1(eps)  # ε <= ln(1 − p): every outcome has loss > ε
    thr = math.log1p(-p) if p < 1.0 else -math.inf
    m = eps > thr
    if mu == 0.0:
        return np.asarray(np.maximum(out, 0.0), dtype=float)
    e = eps[m]
    log_c = _log_expm1_plus(e, p)  # ln(e^ε − 1 + p) = ln p + μx − μ²/2
    x = (log_c - math.log(p) + 0.5 * mu * mu) / mu
    z = x - mu
    res = np.empty_like(e)
    # z > 0: δ = (p/2) e^{−z²/2} [erfcx(z/√2) − erfcx(x/√2)]  (no cancellation)
    big = z > 0
    zb, xb = z[big], x[big]
    res[big] = (
        0.5
        * p
        * np.exp(-0.5 * zb * zb)
        * (special.erfcx(zb / _SQRT2) - special.erfcx(xb / _SQRT2))
    )
    zs, xs, cs = z[~big], x[~big], log_c[~big]
    res[~big] = p * special.ndtr(-zs) - np.exp(cs + special.log_ndtr(-xs))
    out[m] = res
    return np.asarray(np.maximum(out, 0.0), dtype=float)


def _delta_add(eps: np.ndarray, mu: float, p: float) -> np.ndarray:
    """δ of ``(N(0,1), (1−p)N(0,1) + pN(μ,1))``; docs/analyses.md."""
    out = np.zeros_like(eps)
    thr = -math.log1p(-p) if p < 1.0 else math.inf
    m = eps < thr
    if mu == 0.0:
        return out
    e = eps[m]
    log_c = _log_expm1_plus(-e, p)  # ln(e^{−ε} − 1 + p)
    y = (log_c - math.log(p) + 0.5 * mu * mu) / mu
    res = np.empty_like(e)
    neg = y < 0
    yn, en = y[neg], e[neg]
    # y < 0: δ = e^ε (p/2) e^{−(y−μ)²/2} [erfcx(−y/√2) − erfcx((μ−y)/√2)]
    res[neg] = (
        0.5
        * p
        * np.exp(en - 0.5 * (yn - mu) ** 2)
        * (special.erfcx(-yn / _SQRT2) - special.erfcx((mu - yn) / _SQRT2))
    )
    yp, ep = y[~neg], e[~neg]
    res[~neg] = special.ndtr(yp) - np.exp(ep) * (
        (1.0 - p) * special.ndtr(yp) + p * special.ndtr(yp - mu)
    )
    out[m] = res
    return np.asarray(np.maximum(out, 0.0), dtype=float)


def subsampled_gaussian_delta(
    epsilon: ArrayLike,
    *,
    mu: float,
    sampling_probability: float,
    direction: str = "symmetric",
) -> np.ndarray:
    """Return the privacy profile δ(ε) of the subsampled Gaussian, in closed form.

    With ``P = N(0,1)``, ``M = (1 − p)N(0,1) + pN(μ,1)``:
    ``"remove"`` is ``D_{e^ε}(M‖P)``, ``"add"`` is ``D_{e^ε}(P‖M)``
    (dp_accounting's ``AdjacencyType.REMOVE`` / ``ADD``), and ``"symmetric"``
    is their maximum, the profile of ``C_p(G_μ)`` (docs/analyses.md).

    Parameters
    ----------
    epsilon : array_like
        Real ε (any sign).
    mu : float
        GDP parameter of the un-subsampled step (>= 0).
    sampling_probability : float
        ``p`` in (0, 1].
    direction : {"symmetric", "add", "remove"}
        Which profile.

    Returns
    -------
    numpy.ndarray
        δ(ε), the shape of ``epsilon``; tails evaluated with ``erfcx`` so they
        keep relative accuracy down to ~1e-300.

    Raises
    ------
    InvalidParameterError
        If a parameter is outside its domain.

    References
    ----------
    .. [1] docs/analyses.md; Dong, Roth and Su, Theorem 4.2.
    """
    eps = np.asarray(epsilon, dtype=float)
    if np.any(np.isnan(eps)):
        raise InvalidParameterError(f"epsilon must not be NaN; got {epsilon!r}")
    m = check_nonnegative("mu", mu)
    p = _check_p(sampling_probability)
    flat = eps.ravel()
    if direction == "remove":
        out = _delta_remove(flat, m, p)
    elif direction == "add":
        out = _delta_add(flat, m, p)
    elif direction == "symmetric":
        out = np.maximum(_delta_remove(flat, m, p), _delta_add(flat, m, p))
    else:
        raise InvalidParameterError(
            f"direction must be 'symmetric', 'add' or 'remove'; got {direction!r}"
        )
    return out.reshape(eps.shape)


def _grid_range(mu: float, p: float, h: float) -> tuple[int, int]:
    """Return the rounded ε range covering both directions' connect-the-dots bounds."""
    lo, hi = 0.0, 0.0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for adjacency in (
            privacy_loss_mechanism.AdjacencyType.ADD,
            privacy_loss_mechanism.AdjacencyType.REMOVE,
        ):
            bounds = privacy_loss_mechanism.GaussianPrivacyLoss(
                1.0 / mu, sampling_prob=p, adjacency_type=adjacency
            ).connect_dots_bounds()
            lo = min(lo, float(bounds.epsilon_lower))
            hi = max(hi, float(bounds.epsilon_upper))
    return math.floor(lo / h), math.ceil(hi / h)


@functools.lru_cache(maxsize=64)
def _one_step_pld(
    mu: float, p: float, h: float, pessimistic: bool
) -> PrivacyLossDistribution:
    lo, hi = _grid_range(mu, p, h)
    eps = np.arange(lo, hi + 1) * h
    return PrivacyLossDistribution(_grid_pmf(eps, lo, mu, p, h, pessimistic))


def _lower_hull(t: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Values at ``t`` of the lower convex hull of the points ``(t, v)``."""
    keep: list[int] = []
    for i in range(t.size):
        while len(keep) >= 2:
            i0, i1 = keep[-2], keep[-1]
            # drop i1 if it lies on or above the segment i0 -> i
            cross = (t[i1] - t[i0]) * (v[i] - v[i0]) - (v[i1] - v[i0]) * (t[i] - t[i0])
            if cross <= 0:
                keep.pop()
            else:
                break
        keep.append(i)
    return np.asarray(np.interp(t, t[keep], v[keep]), dtype=float)


def _grid_pmf(
    eps: np.ndarray, lo: int, mu: float, p: float, h: float, pessimistic: bool
) -> pld_pmf.PLDPmf:
    """Build a PLD on the grid ``eps`` bounding ``C_p(G_μ)`` above or below.

    In ``t = e^ε`` the true profile ``δ(t)`` is convex, with subgradient
    ``−Q(L > ε)`` (``Q`` the second distribution of the active direction), and
    a PLD supported on the grid has a profile that is piecewise linear in
    ``t`` with kinks at the grid points; its masses are read off the changes
    of slope (``Q``-mass = slope change, ``P``-mass = ``t`` · ``Q``-mass).

    *Pessimistic* (connect the dots, Doroshenko et al. 2022 Alg. 1): the chords
    through ``(0, 1)``, ``(t_i, δ(t_i))`` and ``δ(t_n)`` as mass at +∞; chords
    of a convex function lie above it.

    *Optimistic*: on each interval the chord exceeds ``δ`` by at most the
    height of the triangle cut off by the two supporting lines, so points
    lowered by the larger adjacent height (and 0 at the top) interpolate below
    ``δ``; their lower convex hull through ``(0, 1)`` is the profile of a valid
    pair dominated by the true one. By Blackwell's theorem all its
    compositions are dominated by the true compositions, so every δ it reports
    is a lower bound. Its error is second order in ``h`` like the pessimistic
    one's, whereas rounding losses down (privacy buckets) errs by up to
    ``T h`` in ε after ``T`` compositions (ε 11.45 instead of 13.88 for
    Table-1 row 1 at ``h = 1e-3``).

    For ``t <= 1`` both work on ``e(t) = δ(t) − (1 − t) = t Q(L <= ε) −
    P(L <= ε) >= 0`` (same changes of slope), computed without cancellation.
    Differencing ``δ ≈ 1 − t`` instead (as dp_accounting's fixed-gap helper
    does) loses ~1e-16/h per mass point, an error that grows with finer ``h``
    and with the number of compositions (5.8e-6 in δ at ``h = 1e-4``,
    ``T = 3534``, ``p = 1``, instead of <= 1e-7).
    """
    d_rem = _delta_remove(eps, mu, p)
    d_add = _delta_add(eps, mu, p)
    use_rem = (d_rem > d_add) | ((d_rem == d_add) & (eps >= 0))
    delta = np.maximum(d_rem, d_add)
    p_le, q_le = _lower_tails(eps, mu, p, use_rem)
    t = np.exp(eps)
    k0 = -lo  # index of ε = 0 (t = 1); the grid always contains it
    # left part (t in [0, 1]) in e-units, right part (t >= 1) in δ-units
    t_left = np.concatenate(([0.0], t[: k0 + 1]))
    e_left = np.concatenate(
        ([0.0], np.maximum(t[: k0 + 1] * q_le[: k0 + 1] - p_le[: k0 + 1], 0.0))
    )
    e_left[-1] = delta[k0]  # e(1) = δ(1)
    t_right = t[k0:]
    d_right = delta[k0:].copy()
    if pessimistic:
        w_left, w_right = e_left, d_right
        infinity_mass = float(d_right[-1])
    else:
        g_left = np.concatenate(([0.0], q_le[: k0 + 1]))  # de/dt = Q(L <= ε)
        g_right = -(1.0 - q_le[k0:])  # dδ/dt = −Q(L > ε)
        gaps = np.concatenate(
            (
                _triangle_gaps(t_left, e_left, g_left),
                _triangle_gaps(t_right, d_right, g_right),
            )
        )  # one per interval, [0, t_1] first
        c = np.maximum(np.append(gaps, 0.0), np.insert(gaps, 0, 0.0))  # per point
        v_left = np.maximum(e_left - c[: k0 + 2], 0.0)
        v_left[0] = 0.0
        v_right = np.maximum(d_right - c[k0 + 1 :], 0.0)
        v_right[-1] = 0.0
        w_left = _lower_hull(t_left, v_left)
        w_right = _lower_hull(t_right, v_right)
        infinity_mass = 0.0
    s_left = np.diff(w_left) / np.diff(t_left) - 1.0  # back to δ-units
    s_right = np.diff(w_right) / np.diff(t_right)
    slopes = np.concatenate((s_left, s_right, [0.0]))
    q_mass = np.maximum(np.diff(slopes), 0.0)  # Q-mass at t_1..t_n
    probs = t * q_mass  # P-mass = e^ε · Q-mass
    return pld_pmf.DensePLDPmf(h, lo, probs, infinity_mass, pessimistic)


def _triangle_gaps(t: np.ndarray, f: np.ndarray, g: np.ndarray) -> np.ndarray:
    """Upper bounds on ``max (chord − f)`` over each interval of a convex ``f``."""
    width = np.diff(t)
    slope = np.diff(f) / width
    den = g[1:] - g[:-1]
    with np.errstate(divide="ignore", invalid="ignore"):
        gap = np.where(
            den > 0,
            width
            * np.clip(slope - g[:-1], 0.0, None)
            * np.clip(g[1:] - slope, 0.0, None)
            / den,
            0.0,
        )
    # safety for rounding in f and g (relative 1e-6 of the gap, plus 1e-18 of f)
    scale = np.maximum(np.abs(f[1:]), np.abs(f[:-1]))
    return np.asarray(gap * (1.0 + 1e-6) + 1e-18 * scale, dtype=float)


def _lower_tails(
    eps: np.ndarray, mu: float, p: float, use_rem: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """``P(L <= ε)`` and ``Q(L <= ε)`` of the active direction."""
    p_le = np.empty_like(eps)
    q_le = np.empty_like(eps)
    if mu == 0.0:
        le = (eps >= 0).astype(float)
        return le, le.copy()
    # remove pair: P = (1-p)N(0,1) + pN(μ,1), Q = N(0,1), L increasing in x
    r = use_rem
    thr_r = math.log1p(-p) if p < 1.0 else -math.inf
    er = eps[r]
    xr = np.full_like(er, -np.inf)
    mr = er > thr_r
    xr[mr] = (_log_expm1_plus(er[mr], p) - math.log(p) + 0.5 * mu * mu) / mu
    p_le[r] = (1.0 - p) * special.ndtr(xr) + p * special.ndtr(xr - mu)
    q_le[r] = special.ndtr(xr)
    # add pair: P = N(0,1), Q = (1-p)N(0,1) + pN(μ,1), L decreasing in x
    a = ~use_rem
    thr_a = -math.log1p(-p) if p < 1.0 else math.inf
    ea = eps[a]
    ya = np.full_like(ea, -np.inf)
    ma = ea < thr_a
    ya[ma] = (_log_expm1_plus(-ea[ma], p) - math.log(p) + 0.5 * mu * mu) / mu
    p_le[a] = special.ndtr(-ya)
    q_le[a] = (1.0 - p) * special.ndtr(-ya) + p * special.ndtr(mu - ya)
    return p_le, q_le


def subsampled_gaussian_pld(
    *,
    noise_multiplier: float,
    sampling_probability: float,
    value_discretization: float = 1e-3,
    pessimistic: bool = True,
) -> PrivacyLossDistribution:
    """Return the symmetric PLD of one step ``C_p(G_{1/σ})``.

    The profile ``δ_C = max(δ_add, δ_rem)`` is symmetrised *before* building
    the PLD, so that composing it gives ``C_p(G_{1/σ})^{⊗T}`` (docs/analyses.md).

    Parameters
    ----------
    noise_multiplier : float
        The paper's σ (> 0): one un-subsampled step is ``G_{1/σ}``.
    sampling_probability : float
        ``p = B/n`` in (0, 1].
    value_discretization : float, default 1e-3
        Grid step ``h`` of privacy losses.
    pessimistic : bool, default True
        ``True``: connect-the-dots PLD whose δ is >= the true δ for every ε
        and every number of compositions (an upper bound). ``False``: the
        losses rounded down, whose δ is <= the truth (a lower bound).

    Returns
    -------
    PrivacyLossDistribution
        A symmetric dp_accounting PLD (one PMF, add = remove).

    Raises
    ------
    InvalidParameterError
        If a parameter is outside its domain.

    References
    ----------
    .. [1] Doroshenko et al. 2022, Algorithm 1 (connect the dots).
    .. [2] docs/analyses.md.
    """
    sigma = check_positive("noise_multiplier", noise_multiplier)
    p = _check_p(sampling_probability)
    h = check_positive("value_discretization", value_discretization)
    if h > 1.0:
        raise InvalidParameterError(
            f"value_discretization must be <= 1; got {value_discretization!r}"
        )
    return _one_step_pld(1.0 / sigma, p, h, bool(pessimistic))


@functools.lru_cache(maxsize=32)
def _composed(
    mu: float, p: float, count: int, h: float, pessimistic: bool
) -> PrivacyLossDistribution:
    pld = _one_step_pld(mu, p, h, pessimistic)
    if count == 1:
        return pld
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return pld.self_compose(count, tail_mass_truncation=_TAIL_MASS)


def _composed_pair(
    noise_multiplier: object,
    batch_size: object,
    records_per_client: object,
    local_steps: object,
    rounds: object,
    value_discretization: object,
) -> tuple[PrivacyLossDistribution, PrivacyLossDistribution]:
    sigma, p, steps = _check_client(
        noise_multiplier, batch_size, records_per_client, local_steps, rounds
    )
    h = check_positive("value_discretization", value_discretization)
    if h > 1.0:
        raise InvalidParameterError(
            f"value_discretization must be <= 1; got {value_discretization!r}"
        )
    mu = 1.0 / sigma
    return _composed(mu, p, steps, h, True), _composed(mu, p, steps, h, False)


def exact_epsilon(
    delta: float,
    *,
    noise_multiplier: float,
    batch_size: int,
    records_per_client: int,
    local_steps: int,
    rounds: int,
    value_discretization: float = 1e-3,
) -> Bound:
    """Return ε(δ) of ``C_{B/n}(G_{1/σ})^{⊗KR}`` as a bracketing :class:`Bound`.

    Parameters
    ----------
    delta : float
        Target δ in (0, 1).
    noise_multiplier : float
        The paper's σ (> 0; std on the clipped sum ``2Cσ``, replace-one).
    batch_size : int
        ``B`` records per local step.
    records_per_client : int
        ``n`` records held by the client.
    local_steps : int
        ``K`` local steps per round.
    rounds : int
        ``R`` rounds (the client takes at most ``K R`` steps).
    value_discretization : float, default 1e-3
        Privacy-loss grid step ``h``.

    Returns
    -------
    Bound
        ``upper``: from the pessimistic (connect-the-dots) PLD, a certified ε.
        ``lower``: from the optimistic PLD (losses rounded down; dp_accounting's
        1e-15 tail truncation is compensated by asking it for δ + 1e-15), an ε
        the exact value cannot be below. ``estimate``: their midpoint.

    Raises
    ------
    InvalidParameterError
        If a parameter is outside its domain.

    References
    ----------
    .. [1] Zheng et al. 2021, Theorem 2; docs/analyses.md.
    """
    d = check_delta("delta", delta)
    pess, opt = _composed_pair(
        noise_multiplier,
        batch_size,
        records_per_client,
        local_steps,
        rounds,
        value_discretization,
    )
    upper = float(pess.get_epsilon_for_delta(d))
    lower = float(opt.get_epsilon_for_delta(d + _TAIL_MASS))
    lower = min(lower, upper)
    return Bound(lower, 0.5 * (lower + upper), upper)


def exact_delta(
    epsilon: float,
    *,
    noise_multiplier: float,
    batch_size: int,
    records_per_client: int,
    local_steps: int,
    rounds: int,
    value_discretization: float = 1e-3,
) -> Bound:
    """Return δ(ε) of ``C_{B/n}(G_{1/σ})^{⊗KR}`` as a bracketing :class:`Bound`.

    Parameters
    ----------
    epsilon : float
        Any finite real ε.
    noise_multiplier : float
        The paper's σ (> 0; std on the clipped sum ``2Cσ``, replace-one).
    batch_size : int
        ``B`` records per local step.
    records_per_client : int
        ``n`` records held by the client.
    local_steps : int
        ``K`` local steps per round.
    rounds : int
        ``R`` rounds.
    value_discretization : float, default 1e-3
        Privacy-loss grid step ``h``.

    Returns
    -------
    Bound
        ``upper`` from the pessimistic PLD, ``lower`` from the optimistic PLD
        minus the 1e-15 truncated tail (floored at 0), ``estimate`` midpoint.

    Raises
    ------
    InvalidParameterError
        If a parameter is outside its domain.

    References
    ----------
    .. [1] Zheng et al. 2021, Theorem 2; docs/analyses.md.
    """
    eps = _finite("epsilon", epsilon)
    pess, opt = _composed_pair(
        noise_multiplier,
        batch_size,
        records_per_client,
        local_steps,
        rounds,
        value_discretization,
    )
    upper = min(1.0, float(pess.get_delta_for_epsilon(eps)))
    lower = max(0.0, float(opt.get_delta_for_epsilon(eps)) - _TAIL_MASS)
    lower = min(lower, upper)
    return Bound(lower, 0.5 * (lower + upper), upper)


def mu_effective(*, epsilon: float, delta: float) -> float:
    """Return the GDP ``μ`` whose curve passes through (ε, δ).

    Used to express an exact (ε, δ) as the Gaussian-DP ``μ`` with the same
    (ε, δ) point (docs/analyses.md, column ``mu_eff``); the full composed trade-off
    is *not* Gaussian, so this ``μ`` describes that one point only.

    Parameters
    ----------
    epsilon : float
        ε (>= 0).
    delta : float
        δ in (0, 1).

    Returns
    -------
    float
        ``μ`` with ``gdp_delta(epsilon, mu=μ) == delta``.

    Raises
    ------
    InvalidParameterError
        If a parameter is outside its domain.

    References
    ----------
    .. [1] Dong, Roth and Su, Corollary 2.13.
    """
    return gdp_mu(epsilon=epsilon, delta=delta)


# ----------------------------------------------------------------------------
# weak and strong federated f-DP
# ----------------------------------------------------------------------------
def _broadcast(
    values: dict[str, Any], num_clients: int | None
) -> list[tuple[Any, ...]]:
    lengths = {len(v) for v in values.values() if isinstance(v, Sequence | np.ndarray)}
    if len(lengths) > 1:
        raise InvalidParameterError(
            f"per-client sequences must have equal lengths; got {sorted(lengths)}"
        )
    m = lengths.pop() if lengths else None
    if num_clients is not None:
        nc = check_count("num_clients", num_clients, minimum=2)
        if m is not None and m != nc:
            raise InvalidParameterError(
                f"num_clients must equal the length of per-client sequences "
                f"({m}); got {num_clients!r}"
            )
        m = nc
    if m is None:
        m = 1
    cols = [
        list(v) if isinstance(v, Sequence | np.ndarray) else [v] * m
        for v in values.values()
    ]
    if m < 1:
        raise InvalidParameterError("at least one client is needed")
    return list(zip(*cols))


def _federated(
    notion: str,
    noise_multiplier: float | Sequence[float],
    batch_size: int | Sequence[int],
    records_per_client: int | Sequence[int],
    local_steps: int | Sequence[int],
    rounds: int,
    delta: float,
    value_discretization: float,
    num_clients: int | None,
) -> Guarantee:
    d = check_delta("delta", delta)
    clients = _broadcast(
        {
            "noise_multiplier": noise_multiplier,
            "batch_size": batch_size,
            "records_per_client": records_per_client,
            "local_steps": local_steps,
        },
        num_clients,
    )
    m = len(clients)
    mus = [
        clt_mu(
            noise_multiplier=s,
            batch_size=b,
            records_per_client=n,
            local_steps=k,
            rounds=rounds,
        )
        for s, b, n, k in clients
    ]
    exact: dict[tuple[float, int, int, int], Bound] = {}
    for s, b, n, k in clients:
        key = (float(s), int(b), int(n), int(k))
        if key not in exact:
            exact[key] = exact_epsilon(
                d,
                noise_multiplier=s,
                batch_size=b,
                records_per_client=n,
                local_steps=k,
                rounds=rounds,
                value_discretization=value_discretization,
            )
    uppers = [exact[(float(s), int(b), int(n), int(k))].upper for s, b, n, k in clients]
    j = int(np.argmax(uppers))
    s_j, b_j, n_j, k_j = clients[j]
    bound = exact[(float(s_j), int(b_j), int(n_j), int(k_j))]
    mu_max = max(mus)
    values: dict[str, Any] = {
        "epsilon": bound,
        "delta": d,
        "mu_effective": mu_effective(epsilon=bound.upper, delta=d),
        "least_private_client": j,
        "mu_clt": mu_max,
        "epsilon_clt": gdp_epsilon(d, mu=mu_max),
        "num_clients": m,
    }
    notes = [
        "epsilon is exact: C_{B/n}(G_{1/sigma})^{(x)KR} of the least private "
        "client, composed with a PLD (upper: pessimistic, lower: optimistic).",
        "mu_clt is the CLT limit of Theorem 2 (G_{mu_max}): an approximation, "
        "not a bound.",
        "sigma is the paper's: noise std on the clipped sum is 2*C*sigma "
        "(replace-one); Opacus' noise_multiplier equals 2*sigma.",
        "no amplification by client sampling p is claimed (Lemma 3.8's p^2 "
        "term is not justified; docs/analyses.md).",
    ]
    if notion == "weak":
        adversary = (
            "any single other client i, who sees its own helper model "
            "(weak federated f-DP, one-vs-one)"
        )
    else:
        adversary = (
            "all other clients jointly, who see every helper model but j's "
            "(strong federated f-DP, one-vs-all)"
        )
        mu_paper = math.sqrt(m - 1) * mu_max
        values["mu_paper"] = mu_paper
        values["epsilon_paper"] = gdp_epsilon(d, mu=mu_paper)
        notes.append(
            "the same exact bound holds against all other clients jointly: every "
            "helper is post-processing of the transcript in which only client j's "
            "K*R noisy steps touch its data (docs/analyses.md)."
        )
        notes.append(
            "mu_paper = sqrt(m-1)*mu_max is the paper's Theorem 2 strong bound "
            "G_{sqrt(m-1) mu_max}: valid but loose; reported beside, not instead."
        )
    return Guarantee(
        unit="record",
        neighbouring="replace-one",
        adversary=adversary,
        analysis="sound (exact PLD composition); CLT mu reported beside",
        values=values,
        notes=tuple(notes),
    )


def weak_federated(
    *,
    noise_multiplier: float | Sequence[float],
    batch_size: int | Sequence[int],
    records_per_client: int | Sequence[int],
    local_steps: int | Sequence[int],
    rounds: int,
    delta: float = 1e-5,
    value_discretization: float = 1e-3,
    num_clients: int | None = None,
) -> Guarantee:
    """Return PriFedSync's weak federated f-DP guarantee (least private client).

    Weak federated f-DP (Definition 3.5): for every pair ``i != j``,
    ``T(M_i(S), M_i(S'^j)) >= f``. By Theorem 2 (post-processing of client
    ``j``'s NoisySGD) ``f = C_{B_j/n_j}(G_{1/σ_j})^{⊗KR}`` for client ``j``,
    so the federation's guarantee is that of the least private client; dpfl
    reports it exactly (ε at ``delta``) and the CLT ``G_{μ_max}`` beside it.

    Parameters
    ----------
    noise_multiplier : float or sequence of float
        Paper's σ per client (scalar: the same for all).
    batch_size : int or sequence of int
        ``B_j`` per client.
    records_per_client : int or sequence of int
        ``n_j`` per client.
    local_steps : int or sequence of int
        ``K`` (per client if a sequence).
    rounds : int
        ``R`` synchronisation rounds.
    delta : float, default 1e-5
        The δ at which ε is reported (the paper's tables imply 1e-5).
    value_discretization : float, default 1e-3
        PLD grid step.
    num_clients : int, optional
        ``m`` (needed only when every parameter is a scalar).

    Returns
    -------
    Guarantee
        ``values``: ``epsilon`` (:class:`Bound`), ``delta``, ``mu_effective``,
        ``least_private_client``, ``mu_clt`` (= μ_max), ``epsilon_clt``,
        ``num_clients``.

    Raises
    ------
    InvalidParameterError
        If a parameter is outside its domain or sequences differ in length.

    References
    ----------
    .. [1] Zheng et al. 2021, Definition 3.5, Theorem 2.
    """
    return _federated(
        "weak",
        noise_multiplier,
        batch_size,
        records_per_client,
        local_steps,
        rounds,
        delta,
        value_discretization,
        num_clients,
    )


def strong_federated(
    *,
    noise_multiplier: float | Sequence[float],
    batch_size: int | Sequence[int],
    records_per_client: int | Sequence[int],
    local_steps: int | Sequence[int],
    rounds: int,
    delta: float = 1e-5,
    value_discretization: float = 1e-3,
    num_clients: int | None = None,
) -> Guarantee:
    """Return PriFedSync's strong federated f-DP guarantee (sound and paper's).

    Strong federated f-DP (Definition 3.6): ``T(M_{−j}(S), M_{−j}(S'^j)) >= f``
    against all other clients' helper models jointly. The sound bound is the
    same as the weak one, ``C_{B/n}(G_{1/σ})^{⊗KR}`` (≈ ``G_{μ_max}``),
    because all helpers are post-processing of one transcript in which only
    client ``j``'s ``KR`` noisy steps touch its records (docs/analyses.md). The
    paper's ``G_{sqrt(m−1) μ_max}`` (valid, loose) is reported beside it.

    Parameters
    ----------
    noise_multiplier : float or sequence of float
        Paper's σ per client (scalar: the same for all).
    batch_size : int or sequence of int
        ``B_j`` per client.
    records_per_client : int or sequence of int
        ``n_j`` per client.
    local_steps : int or sequence of int
        ``K`` (per client if a sequence).
    rounds : int
        ``R`` synchronisation rounds.
    delta : float, default 1e-5
        The δ at which ε is reported.
    value_discretization : float, default 1e-3
        PLD grid step.
    num_clients : int, optional
        ``m`` (required when every parameter is a scalar; >= 2).

    Returns
    -------
    Guarantee
        As :func:`weak_federated`, plus ``mu_paper`` (= sqrt(m−1) μ_max) and
        ``epsilon_paper``.

    Raises
    ------
    InvalidParameterError
        If a parameter is outside its domain, or ``m`` is unknown or < 2.

    References
    ----------
    .. [1] Zheng et al. 2021, Definition 3.6, Theorem 2.
    """
    if num_clients is None and not any(
        isinstance(v, Sequence | np.ndarray)
        for v in (noise_multiplier, batch_size, records_per_client, local_steps)
    ):
        raise InvalidParameterError(
            "num_clients is required when every per-client parameter is a scalar"
        )
    g = _federated(
        "strong",
        noise_multiplier,
        batch_size,
        records_per_client,
        local_steps,
        rounds,
        delta,
        value_discretization,
        num_clients,
    )
    if g.values["num_clients"] < 2:
        raise InvalidParameterError(
            f"strong federated f-DP needs >= 2 clients; got {g.values['num_clients']}"
        )
    return g


# ----------------------------------------------------------------------------
# helpers
# ----------------------------------------------------------------------------
def _as_vector_fn(fn: Callable[..., ArrayLike]) -> Callable[[np.ndarray], np.ndarray]:
    """Wrap ``fn`` so it maps a 1-D array to an array of the same shape."""
    if not callable(fn):
        raise InvalidParameterError(f"expected a callable; got {fn!r}")

    def wrapped(x: np.ndarray) -> np.ndarray:
        try:
            y = np.asarray(fn(x), dtype=float)
            if y.shape == x.shape:
                return y
        except (TypeError, ValueError):
            pass
        return np.array([float(np.asarray(fn(float(v)))) for v in x])

    return wrapped


def _pld_support(pld: PrivacyLossDistribution) -> np.ndarray:
    """Every finite privacy loss in ``pld`` (both directions)."""
    supports = []
    for name in ("_pmf_remove", "_pmf_add"):
        pmf = getattr(pld, name, None)
        if pmf is None:
            continue
        try:
            dense = pmf.to_dense_pmf()
            losses = (np.arange(dense.size) + dense._lower_loss) * dense._discretization
        except AttributeError:  # pragma: no cover - dp_accounting internals moved
            losses = np.arange(-15000, 15001) * 1e-3
        supports.append(losses)
    if not supports:  # pragma: no cover
        return np.arange(-15000, 15001) * 1e-3
    return np.unique(np.concatenate(supports))


# -- the price of sampling without replacement (registered with the Accountant) --
def _replace_one_subsampled(
    rate: float, inner: ev.Event, discretization: float
) -> pricing.PldPair:
    """C_rate(G_mu) symmetrised: uniform subset without replacement, replace-one.

    A replaced contribution moves the sum by up to twice its norm, so the
    Gaussian's sensitivity doubles (the convention of
    :mod:`dpfl.accounting.schemes`).
    """
    sigma = pricing.unit_gaussian(inner)
    if sigma is None:
        raise UnsupportedEventError(
            f"sampling without replacement is priced over a Gaussian; got {inner!r}"
        )
    # fdp's noise multiplier is the one whose single step is G_{1/sigma}.
    kw: dict[str, Any] = {
        "noise_multiplier": sigma / 2.0,
        "sampling_probability": rate,
        "value_discretization": discretization,
    }
    return (
        subsampled_gaussian_pld(pessimistic=True, **kw),
        subsampled_gaussian_pld(pessimistic=False, **kw),
    )


@pricing.prices(ev.WithoutReplacement)
def _price_without_replacement(
    event: ev.WithoutReplacement, *, analysis: str, discretization: float
) -> pricing.PldPair:
    return _replace_one_subsampled(
        event.sampling_probability, event.event, discretization
    )


@pricing.prices(ev.FixedCohort)
def _price_fixed_cohort(
    event: ev.FixedCohort, *, analysis: str, discretization: float
) -> pricing.PldPair:
    if analysis in ("sound-rdp", "paper", "paper-rdp"):
        raise UnsupportedEventError(
            f"the {analysis!r} analysis of a fixed cohort is a Renyi-DP "
            "accountant, not a privacy-loss distribution: use "
            "dpfl.accounting.rdp.dp_fedavg_epsilon, or a ledger with the "
            "moments-accountant guard (dpfl.accounting.guards) "
            "for the paper's stop rule"
        )
    if analysis == "paper-pld":
        # Geyer et al.'s reading: the cohort as Poisson sampling at rate m/K
        # (add/remove); not valid for fixed-size cohorts.
        return pricing.poisson_of_gaussian(
            event.sampling_probability, event.event, discretization
        )
    return _replace_one_subsampled(
        event.sampling_probability, event.event, discretization
    )
