"""Trade-off functions and PriFedSync's CLT μ; the prices of replace-one sampling.

The subsampled Gaussian's exact PLDs are in :mod:`dpfl.accounting.subsampled`
and the weak / strong federated f-DP of Theorems 1-2 in
:mod:`dpfl.accounting.federated`.

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

import math
from collections.abc import Callable
from typing import Any

import numpy as np
from dp_accounting.pld.privacy_loss_distribution import PrivacyLossDistribution
from numpy.typing import ArrayLike
from scipy import optimize, special

from dpfl._validate import (
    check_nonnegative,
)
from dpfl.accounting import events as ev
from dpfl.accounting import pricing
from dpfl.accounting.gaussian import (
    _check_alpha,
    _finite,
)
from dpfl.accounting.subsampled import (
    _SQRT2,
    _check_client,
    _check_p,
    subsampled_gaussian_pld,
)
from dpfl.errors import InvalidParameterError, UnsupportedEventError

__all__ = [
    "clt_mu",
    "delta_from_tradeoff",
    "identity_tradeoff",
    "subsampled_tradeoff",
    "tradeoff_from_deltas",
]


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


# ----------------------------------------------------------------------------
# subsampled Gaussian: closed-form privacy profiles and PLDs
# ----------------------------------------------------------------------------


# ----------------------------------------------------------------------------
# weak and strong federated f-DP
# ----------------------------------------------------------------------------


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
