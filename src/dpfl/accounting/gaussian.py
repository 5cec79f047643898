"""The Gaussian mechanism: exact (ε, δ) curve, calibration, and Gaussian DP.

Units used throughout
---------------------
``noise_multiplier`` is the standard deviation of the Gaussian noise divided by
the clipping norm ``C`` (the unit of the query), and ``sensitivity`` is the
ℓ2-sensitivity of the query in the same unit: ``1`` when one clipped
contribution is added or removed, ``2`` when one is replaced by another. With
``C = 1`` these are simply the noise standard deviation ``σ`` and the
sensitivity ``Δ``. The mechanism is then exactly ``μ``-GDP with
``μ = sensitivity / noise_multiplier`` (:func:`mu_from_noise`), and every
(ε, δ) statement below is the closed form of that trade-off function
``G_μ(α) = Φ(Φ⁻¹(1 − α) − μ)``.

References
----------
.. [BW18] B. Balle and Y.-X. Wang, "Improving the Gaussian mechanism for
   differential privacy: analytical calibration and optimal denoising",
   ICML 2018, Theorem 8.
.. [DRS] J. Dong, A. Roth and W. J. Su, "Gaussian differential privacy",
   JRSS-B 2022 (arXiv 1905.02383), Corollary 2.13.
.. [DR14] C. Dwork and A. Roth, "The algorithmic foundations of differential
   privacy", 2014, Theorem A.1 / 3.22.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import ArrayLike
from scipy import optimize, special

from dpfl._validate import (
    _real,
    check_delta,
    check_nonnegative,
    check_positive,
)
from dpfl.errors import InvalidParameterError

__all__ = [
    "calibrate_analytic",
    "classic_sigma",
    "delta_for_epsilon",
    "epsilon_for_delta",
    "gaussian_tradeoff",
    "gdp_delta",
    "gdp_epsilon",
    "gdp_mu",
    "mu_from_noise",
]

_SQRT2 = math.sqrt(2.0)
# Largest μ the root finders search; δ(ε; μ) is within 1e-300 of 1 well before.
_MU_MAX = 1e4


# ----------------------------------------------------------------------------
# kernels (μ-parametrised, no validation)
# ----------------------------------------------------------------------------
def _log_gdp_delta(epsilon: float, mu: float) -> float:
    """Return ``ln δ(ε)`` of ``μ``-GDP, stable for large ε (no cancellation).

    With ``a = μ/2 − ε/μ`` and ``b = a − μ`` one has ``b² = a² + 2ε``, so
    ``e^ε Φ(b) = ½ erfcx(−b/√2) e^{−a²/2}`` and, for ``a < 0``,
    ``δ = ½ e^{−a²/2} [erfcx(−a/√2) − erfcx(−b/√2)]``: a difference of two
    O(1/|a|) numbers instead of two numbers of size e^{−a²/2}.
    """
    if mu == 0.0:
        return -math.inf if epsilon >= 0 else math.log(-math.expm1(epsilon))
    a = mu / 2.0 - epsilon / mu
    b = a - mu
    if a < 0.0:
        diff = special.erfcx(-a / _SQRT2) - special.erfcx(-b / _SQRT2)
        if not diff > 0.0:
            return -math.inf
        return -0.5 * a * a + math.log(0.5 * diff)
    # a >= 0: Φ(a) >= 1/2, direct evaluation loses no relative accuracy that matters
    log_first = special.log_ndtr(a)
    log_second = epsilon + special.log_ndtr(b)
    if log_second >= log_first:
        return -math.inf
    return float(log_first + math.log(-math.expm1(log_second - log_first)))


def _gdp_delta(epsilon: float, mu: float) -> float:
    return math.exp(_log_gdp_delta(epsilon, mu))


def _gdp_epsilon(delta: float, mu: float) -> float:
    """Smallest ε >= 0 with δ(ε; μ) <= δ (δ is decreasing in ε)."""
    log_target = math.log(delta)
    if _log_gdp_delta(0.0, mu) <= log_target:
        return 0.0
    hi = max(1.0, mu * mu)
    while _log_gdp_delta(hi, mu) > log_target:
        hi *= 2.0
    root = optimize.brentq(
        lambda e: _log_gdp_delta(e, mu) - log_target,
        0.0,
        hi,
        xtol=1e-14,
        rtol=4 * np.finfo(float).eps,
    )
    # brentq's root may sit on either side; return a value certified by the
    # closed form (never below the true ε).
    while _gdp_delta(root, mu) > delta:
        root = math.nextafter(root, math.inf) + 1e-15 * max(1.0, root)
    return float(root)


def _gdp_mu(epsilon: float, delta: float) -> float:
    """Return the μ with δ(ε; μ) = δ (δ is increasing in μ)."""
    log_target = math.log(delta)
    lo, hi = 1e-8, 1.0
    while _log_gdp_delta(epsilon, hi) < log_target:
        hi *= 2.0
        if hi > _MU_MAX:  # pragma: no cover - δ(ε; 1e4) is 1 to machine precision
            raise InvalidParameterError(
                f"no mu <= {_MU_MAX} reaches delta={delta!r} at epsilon={epsilon!r}"
            )
    if _log_gdp_delta(epsilon, lo) >= log_target:
        return lo
    return float(
        optimize.brentq(
            lambda m: _log_gdp_delta(epsilon, m) - log_target,
            lo,
            hi,
            xtol=1e-15,
            rtol=4 * np.finfo(float).eps,
        )
    )


# ----------------------------------------------------------------------------
# Gaussian mechanism in (noise_multiplier, sensitivity) units
# ----------------------------------------------------------------------------
def mu_from_noise(*, noise_multiplier: float, sensitivity: float = 1.0) -> float:
    """Return the GDP parameter ``μ = sensitivity / noise_multiplier``.

    Parameters
    ----------
    noise_multiplier : float
        Noise standard deviation divided by the clipping norm (> 0).
    sensitivity : float, default 1.0
        ℓ2-sensitivity in units of the clipping norm (> 0); 1 for add/remove,
        2 for replace-one.

    Returns
    -------
    float
        The Gaussian mechanism is exactly ``μ``-GDP for this ``μ``.

    Raises
    ------
    InvalidParameterError
        If a parameter is not a finite positive number.

    References
    ----------
    .. [1] Dong, Roth and Su, "Gaussian differential privacy", Theorem 2.7.
    """
    sigma = check_positive("noise_multiplier", noise_multiplier)
    sens = check_positive("sensitivity", sensitivity)
    return sens / sigma


def delta_for_epsilon(
    epsilon: float, *, noise_multiplier: float, sensitivity: float = 1.0
) -> float:
    """Return the exact δ(ε) of the Gaussian mechanism (analytic Gaussian).

    ``δ(ε) = Φ(Δ/2σ − εσ/Δ) − e^ε Φ(−Δ/2σ − εσ/Δ)``, evaluated without
    cancellation (log-space, scaled complementary error function) so that it
    keeps full relative accuracy for large ε.

    Parameters
    ----------
    epsilon : float
        Any real ε (negative ε are allowed; the curve is the hockey-stick
        divergence ``sup_S P(S) − e^ε Q(S)``).
    noise_multiplier : float
        Noise standard deviation divided by the clipping norm (> 0).
    sensitivity : float, default 1.0
        ℓ2-sensitivity in units of the clipping norm (> 0).

    Returns
    -------
    float
        The smallest δ for which the mechanism is (ε, δ)-DP.

    Raises
    ------
    InvalidParameterError
        If ``epsilon`` is not a finite real or a noise parameter is not > 0.

    References
    ----------
    .. [1] Balle and Wang, ICML 2018, Theorem 8.
    """
    eps = _finite("epsilon", epsilon)
    mu = mu_from_noise(noise_multiplier=noise_multiplier, sensitivity=sensitivity)
    return _gdp_delta(eps, mu)


def epsilon_for_delta(
    delta: float, *, noise_multiplier: float, sensitivity: float = 1.0
) -> float:
    """Return the smallest ε >= 0 for which the Gaussian mechanism is (ε, δ)-DP.

    Parameters
    ----------
    delta : float
        Target δ in (0, 1).
    noise_multiplier : float
        Noise standard deviation divided by the clipping norm (> 0).
    sensitivity : float, default 1.0
        ℓ2-sensitivity in units of the clipping norm (> 0).

    Returns
    -------
    float
        ε with ``delta_for_epsilon(ε) <= delta`` (0 when already at ε = 0).
        Solved to ~1e-14 relative and rounded up, never down.

    Raises
    ------
    InvalidParameterError
        If ``delta`` is not in (0, 1) or a noise parameter is not > 0.

    References
    ----------
    .. [1] Balle and Wang, ICML 2018, Theorem 8.
    """
    d = check_delta("delta", delta)
    mu = mu_from_noise(noise_multiplier=noise_multiplier, sensitivity=sensitivity)
    return _gdp_epsilon(d, mu)


def calibrate_analytic(
    *, epsilon: float, delta: float, sensitivity: float = 1.0
) -> float:
    """Return the smallest noise multiplier giving (ε, δ)-DP (analytic Gaussian).

    Parameters
    ----------
    epsilon : float
        Target ε (> 0); any size, unlike :func:`classic_sigma`.
    delta : float
        Target δ in (0, 1).
    sensitivity : float, default 1.0
        ℓ2-sensitivity in units of the clipping norm (> 0).

    Returns
    -------
    float
        The noise multiplier σ (noise standard deviation divided by the
        clipping norm; with ``C = 1`` it *is* the standard deviation) such
        that ``delta_for_epsilon(epsilon, noise_multiplier=σ,
        sensitivity=sensitivity) <= delta``; smallest to ~1e-14 relative.

    Raises
    ------
    InvalidParameterError
        If a parameter is outside its domain.

    References
    ----------
    .. [1] Balle and Wang, ICML 2018, Algorithm 1 / Theorem 8.
    """
    eps = check_positive("epsilon", epsilon)
    d = check_delta("delta", delta)
    sens = check_positive("sensitivity", sensitivity)
    mu = _gdp_mu(eps, d)
    sigma = sens / mu
    # certify: nudge up until the closed form meets the target
    while _gdp_delta(eps, sens / sigma) > d:
        sigma = math.nextafter(sigma, math.inf) * (1 + 1e-15)
    return sigma


def classic_sigma(
    *, epsilon: float, delta: float, sensitivity: float = 1.0
) -> tuple[float, str | None]:
    """Return the classic noise multiplier ``sqrt(2 ln(1.25/δ)) Δ / ε``.

    Parameters
    ----------
    epsilon : float
        Target ε (> 0). The formula is proven only for ε < 1.
    delta : float
        Target δ in (0, 1).
    sensitivity : float, default 1.0
        ℓ2-sensitivity in units of the clipping norm (> 0).

    Returns
    -------
    sigma : float
        The classic noise multiplier.
    warning : str or None
        A message when ``epsilon >= 1`` (the theorem does not cover it; use
        :func:`calibrate_analytic`), else ``None``.

    Raises
    ------
    InvalidParameterError
        If a parameter is outside its domain.

    References
    ----------
    .. [1] Dwork and Roth 2014, Theorem 3.22 (requires ε in (0, 1)).
    """
    eps = check_positive("epsilon", epsilon)
    d = check_delta("delta", delta)
    sens = check_positive("sensitivity", sensitivity)
    sigma = math.sqrt(2.0 * math.log(1.25 / d)) * sens / eps
    warning = None
    if eps >= 1.0:
        analytic = calibrate_analytic(epsilon=eps, delta=d, sensitivity=sens)
        warning = (
            f"classic Gaussian formula is valid only for epsilon < 1; got "
            f"epsilon={eps!r}. The analytic Gaussian mechanism needs "
            f"noise_multiplier={analytic:.6g} (calibrate_analytic)."
        )
    return sigma, warning


# ----------------------------------------------------------------------------
# Gaussian differential privacy
# ----------------------------------------------------------------------------
def gdp_delta(epsilon: float, *, mu: float) -> float:
    """Return δ(ε) of ``μ``-GDP: ``Φ(−ε/μ + μ/2) − e^ε Φ(−ε/μ − μ/2)``.

    Parameters
    ----------
    epsilon : float
        Any finite real ε.
    mu : float
        GDP parameter (>= 0; ``μ = 0`` is perfect privacy).

    Returns
    -------
    float
        δ(ε), computed without cancellation for large ε.

    Raises
    ------
    InvalidParameterError
        If ``epsilon`` is not finite or ``mu`` is negative.

    References
    ----------
    .. [1] Dong, Roth and Su, Corollary 2.13.
    """
    eps = _finite("epsilon", epsilon)
    m = check_nonnegative("mu", mu)
    return _gdp_delta(eps, m)


def gdp_epsilon(delta: float, *, mu: float) -> float:
    """Return the smallest ε >= 0 with ``gdp_delta(ε, mu=mu) <= delta``.

    Parameters
    ----------
    delta : float
        Target δ in (0, 1).
    mu : float
        GDP parameter (>= 0).

    Returns
    -------
    float
        ε, solved in log-δ space to ~1e-14 and rounded up.

    Raises
    ------
    InvalidParameterError
        If ``delta`` is not in (0, 1) or ``mu`` is negative.

    References
    ----------
    .. [1] Dong, Roth and Su, Corollary 2.13.
    """
    d = check_delta("delta", delta)
    m = check_nonnegative("mu", mu)
    if m == 0.0:
        return 0.0
    return _gdp_epsilon(d, m)


def gdp_mu(*, epsilon: float, delta: float) -> float:
    """Return the ``μ`` whose GDP curve passes through (ε, δ).

    Parameters
    ----------
    epsilon : float
        ε (>= 0).
    delta : float
        δ in (0, 1).

    Returns
    -------
    float
        ``μ`` with ``gdp_delta(epsilon, mu=μ) == delta`` (to ~1e-15); a
        mechanism is (ε, δ)-DP whenever it is ``μ'``-GDP with ``μ' <= μ``.

    Raises
    ------
    InvalidParameterError
        If a parameter is outside its domain.

    References
    ----------
    .. [1] Dong, Roth and Su, Corollary 2.13.
    """
    eps = check_nonnegative("epsilon", epsilon)
    d = check_delta("delta", delta)
    return _gdp_mu(eps, d)


def gaussian_tradeoff(alpha: ArrayLike, *, mu: float) -> np.ndarray:
    """Return the Gaussian trade-off function ``G_μ(α) = Φ(Φ⁻¹(1 − α) − μ)``.

    Parameters
    ----------
    alpha : array_like
        Type-I errors in [0, 1].
    mu : float
        GDP parameter (>= 0).

    Returns
    -------
    numpy.ndarray
        Type-II errors, the shape of ``alpha``.

    Raises
    ------
    InvalidParameterError
        If ``alpha`` leaves [0, 1] or ``mu`` is negative.

    References
    ----------
    .. [1] Dong, Roth and Su, Definition 2.6.
    """
    a = _check_alpha(alpha)
    m = check_nonnegative("mu", mu)
    # Φ⁻¹(1 − α) = isf(α) keeps precision for tiny α
    return np.asarray(special.ndtr(-special.ndtri(a) - m), dtype=float)


# ----------------------------------------------------------------------------
# helpers shared with fdp.py
# ----------------------------------------------------------------------------
def _finite(name: str, value: object) -> float:
    x = _real(name, value)
    if not math.isfinite(x):
        raise InvalidParameterError(f"{name} must be finite; got {value!r}")
    return x


def _check_alpha(alpha: ArrayLike) -> np.ndarray:
    """Return ``alpha`` as a float array after checking it lies in [0, 1]."""
    try:
        a = np.asarray(alpha, dtype=float)
    except (TypeError, ValueError) as exc:
        raise InvalidParameterError(
            f"alpha must be real numbers in [0, 1]; got {alpha!r}"
        ) from exc
    if np.any(np.isnan(a)) or np.any(a < 0) or np.any(a > 1):
        raise InvalidParameterError(f"alpha must lie in [0, 1]; got {alpha!r}")
    return a
