"""Certified composition of privacy-loss PMFs: an exponentially tilted FFT.

A composition of privacy-loss distributions is a convolution of PMFs, done by
FFT. In floating point the FFT leaves an absolute error of about
``1e-16 log2(N)`` times the vector's 2-norm in *every* output point, of either
sign. Where ``delta`` is small the tail that decides it holds far less mass
than that floor, so an untilted FFT cannot certify anything there. This module
composes *tilted* PMFs instead and bounds every error a priori.

The argument
------------
Let ``x_i`` be the finite part of PMF ``i`` (losses ``l = k h`` on a grid of
step ``h``), composed ``n_i`` times, and ``lam >= 0``. The tilt

    x~_i[k] = x_i[k] exp(lam l_k - kappa_i),   kappa_i = log sum_k x_i[k] e^{lam l_k},

is a probability vector, and the composition of the tilted PMFs is the tilted
composition: ``y~[j] = y[j] exp(lam l_j - sum_i n_i kappa_i)`` (the exponent is
additive in the losses). So ``y[j] = y~[j] U_j`` with
``U_j = exp(sum_i n_i kappa_i - lam l_j)``, and an *absolute* error ``B`` in
``y~`` becomes an error ``B U_j`` in ``y[j]``. ``U_j`` is the Chernoff bound
``E[e^{lam L}] e^{-lam l_j}`` of the composed loss at ``l_j``: choosing ``lam``
for the loss that decides the query (:func:`plan`) makes the error at the
deciding losses a fraction ``B`` of a Chernoff tail of the same size as
``delta`` itself, instead of an absolute ``1e-16``.

``B`` is bounded a priori (:func:`compose`), for a circular FFT of length
``L`` (a power of two) holding the output window ``[a, top]``:

1. Floating-point FFT. We use the normwise bound ``||fl(F v) - F v||_2 <=
   eta_L ||F v||_2`` with ``eta_L = c u log2(L)``, ``u = 2^-53`` and ``c =``
   :data:`FFT_CONSTANT` ``= 16``, for both the forward (``rfft``) and inverse
   (``irfft``) transforms. Higham (2002, *Accuracy and Stability of Numerical
   Algorithms*, Thm 24.2) proves ``eta_L = log2(L) eta / (1 - log2(L) eta)``
   with ``eta = mu + gamma_4 (sqrt 2 + mu) ~ 6.7 u`` for the radix-2
   Cooley-Tukey FFT whose weights are accurate to ``mu ~ u``; pocketfft
   (scipy.fft) transforms powers of two in radix-4 and radix-2 passes (a
   radix-4 butterfly is two radix-2 levels), and ``c = 16`` leaves a factor of
   more than two. ``tests/accounting/test_tilted.py`` measures the error against exact
   rational convolutions: it stays two orders of magnitude below the bound.
2. Forward transforms: ``||X^_i - X_i||_2 <= eta_L sqrt(L) ||x~_i||_2``, hence
   every component ``|X^_{i,k}| <= M_i = m_i + eta_L sqrt(L) ||x~_i||_2``
   (``m_i`` the tilted mass, about 1).
3. The transform of the composition is a polynomial with non-negative
   coefficients in the ``X_i``: a product over the distinct rounds ``p`` of
   ``F_p^{n_p}``, ``F_p = a_0 + sum_j a_j X_j^{k_j}`` (a plain PMF is
   ``F = X``; a round that releases ``k_j`` steps of ``x_j`` with probability
   ``w_j`` and nothing otherwise is a :class:`Mix`, with ``a_j`` the tilted,
   normalised ``w_j``). With every modulus below its bound,
   ``|F_p| <= R_p = a_0 + sum_j a_j M_j^{k_j}``, and the perturbation of a
   polynomial with non-negative coefficients is at most its derivative at
   the moduli' bounds times the input perturbations: component by component
   ``|Delta F_p^{n_p}| <= n_p R_p^{n_p - 1} sum_j a_j k_j M_j^{k_j - 1}
   |Delta X_j|``, and the product's error is the sum of the factors' errors
   times the other factors' bounds ``P_R / R_p^{n_p}`` (``P_R = prod R_p^{n_p}``).
   In 2-norm that is at most ``P_R sum_p (n_p / R_p) sum_j a_j k_j
   M_j^{k_j - 1} eta_L sqrt(L) ||x~_j||_2``.
4. Evaluating a power in polar form (``exp(n log|z|)``, ``n arg z``) costs at
   most ``(12 n + 8) u |z|^n`` per component, with ``|z| <= 1`` up to the
   bounds (the log's error is multiplied by ``n``, and ``|z|^n n |log |z||
   <= 1/e``); moving a term to the absolute grid (a phase) ``4 u``, each sum
   and complex product ``3 u`` of the moduli' bound; over ``L`` components
   that is at most ``sqrt(L)`` times as much in 2-norm.
5. The inverse transform divides the 2-norm by ``sqrt(L)`` (so 2-4 leave at
   most ``P_R (sum_p (n_p / R_p) (eta_L sum_j a_j k_j M_j^{k_j - 1}
   ||x~_j||_2 + u ...) + ...)``, the rounding terms of 4, called ``first``)
   and adds ``eta_L`` times the 2-norm of its input, at most the computed
   output's 2-norm plus its own error: ``E <= (first (1 + eta_L) + eta_L
   ||y^~||_2) / (1 - eta_L)``.
6. Aliasing: the circular result at the window's position of ``j`` adds the
   tilted mass of every index congruent to ``j`` modulo ``L`` outside the
   window; it is at most the tilted mass outside ``[a, top]``, bounded by
   Chernoff bounds of the tilted composition.
7. The tilt and the untilt are evaluated with relative errors at most
   ``2 u (|log x| + |lam l| + |kappa| + 2)`` per entry; a relative
   perturbation of non-negative inputs changes every output of the
   composition by at most the sum of the relative perturbations times the
   counts and powers (``tau``), and the untilt adds ``2 u (|sum n kappa| +
   |lam l_j| + 4)`` (``rho`` is the two together).

So ``|y^~ - y~| <= B = E + A`` everywhere in the window (``A`` the aliasing
of 6; every bound times 1.01 for second-order terms), and

    y[j] <= (max(y^~_j, 0) + B) U_j (1 + 2 rho_j),
    y[j] >= max(y^~_j - B, 0) U_j (1 - 2 rho_j).

The pessimistic (upper) PMF returned is the first envelope, capped at the
total mass; the mass below the window is moved up onto the window's lowest
loss (a loss moved up keeps an upper bound an upper bound) and the mass above
goes to +infinity, each bounded by a Chernoff bound of the untilted
composition. The optimistic (lower) PMF is the second envelope, with the mass
outside the window dropped. Since ``delta(eps) = inf + sum_l p_l (1 -
e^{eps - l})_+`` is non-decreasing in every mass and every loss, the envelopes
bound the true composition's ``delta`` from above and below at every
``eps``, and they stay bounds when composed again (a larger non-negative
input gives a larger convolution).

The reading of ``delta`` or ``epsilon`` off an envelope is a sum of
non-negative terms (see :func:`dpfl.accounting.pld.pmf_epsilon_for_delta`)
whose relative rounding error is at most ``4 (n + 2) u`` for ``n`` grid
points (:func:`summation_margin`); the bracketing functions read the upper
value at ``delta / (1 + that)`` and the lower at ``delta (1 + that)``.

Choosing the tilt (:func:`plan`): for ``epsilon(delta)`` the tilt minimises
``(K(lam) + log c(lam) + log(1/delta)) / lam``, with ``K`` the cumulant
generating function of the composed loss and ``c(lam) = lam^lam /
(1 + lam)^(1 + lam)`` (``(1 - e^{-x})_+ <= c(lam) e^{lam x}``): the Chernoff
estimate of the deciding loss; for ``delta(epsilon)``, it minimises
``K(lam) - lam eps + log c(lam)``. The window is the range holding all but
``A`` of the *tilted* composition on each side (a few of its standard
deviations around the deciding loss), with ``A U`` at the deciding loss
``1e-4`` of the query's delta (``A`` within ``[1e-30, 1e-10]``), and, for
``delta(epsilon)``, ``eps`` itself. Where that window is long because the
tilted composition has a long right tail (a rare round with a large loss),
a smaller tilt whose predicted error stays within a given share of delta
can shorten it (``error_share``, :func:`_cheapest_tilt`). Any ``lam >= 0``
and any window give valid bounds; the choice only makes them tight. The
cumulant generating functions are bounded from above: exactly for PMFs of
at most 2048 non-zero masses, otherwise on at most that many bins
(:meth:`Dist.log_mgf`), so every Chernoff bound used is valid.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import numpy as np
from scipy import fft as sp_fft

from dpfl.accounting.envelope import UNIT_ROUNDOFF, CertifiedPmf
from dpfl.accounting.lossdists import Mix, Parts, _composed_infinity, _log_mgf_total

__all__ = [
    "FFT_CONSTANT",
    "Plan",
    "compose",
    "fft_error_factor",
    "plan",
    "window_length",
]


#: ``c`` in the assumed normwise FFT error bound ``eta_L = c u log2(L)``.
FFT_CONSTANT = 16.0

#: (Tilted) mass left outside a composition's window on each side.
_WINDOW_TAIL = 1e-15


#: Smallest positive double's order: underflowed tilted entries are each
#: below it (an absolute error, counted in ``B``).
_UNDERFLOW = 1e-300


def fft_error_factor(length: int) -> float:
    """``eta_L``: the assumed relative 2-norm error of a length-``length`` FFT."""
    return FFT_CONSTANT * UNIT_ROUNDOFF * max(1.0, math.log2(max(length, 2)))


#: The first grid of :func:`_minimise`, relative to its scale.
_FIRST_GRID = np.geomspace(1e-4, 1e4, 25)
_FIRST_GRID.setflags(write=False)


def _minimise(
    f: Callable[[np.ndarray], np.ndarray],
    scale: float,
    sign: float,
    refinements: int = 3,
) -> tuple[float, float]:
    """``(theta, f(theta))`` near the minimum of ``f`` over ``sign * theta > 0``.

    ``f`` is vectorised; a log-spaced grid over eight decades around
    ``1 / scale`` (a third of a decade apart) is refined ``refinements``
    times around its best point, each time to a fifth of the spacing (the
    ends of a refined grid are points already evaluated). Any point returned
    is a valid choice (the bounds built on it hold for every theta); the
    search only makes them tight.
    """
    base = 1.0 / max(scale, 1e-300)
    grid = sign * base * _FIRST_GRID
    vals = f(grid)
    for _ in range(refinements):
        vals = np.where(np.isfinite(vals), vals, np.inf)
        i = int(np.argmin(vals))
        j, k = max(i - 1, 0), min(i + 1, grid.size - 1)
        lo, hi = abs(grid[j]), abs(grid[k])
        if not (hi > lo > 0):
            break
        ends = vals[j], vals[k]
        grid = sign * np.geomspace(lo, hi, 11)
        vals = np.concatenate([[ends[0]], f(grid[1:-1]), [ends[1]]])
    vals = np.where(np.isfinite(vals), vals, np.inf)
    i = int(np.argmin(vals))
    return float(grid[i]), float(vals[i])


def _log_c(lam: np.ndarray) -> np.ndarray:
    """``log c(lam)``, ``c = lam^lam / (1 + lam)^(1 + lam)``.

    ``c(lam)`` is the supremum of ``(1 - e^{-x}) e^{-lam x}`` over ``x > 0``.
    """
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.asarray(
            np.where(lam > 0, lam * np.log(lam), 0.0) - (1 + lam) * np.log1p(lam)
        )


@dataclasses.dataclass(frozen=True)
class Plan:
    """Tilt and output window (losses) of one composition.

    Attributes
    ----------
    tilt : float
        ``lam >= 0``.
    low, high : float
        The output window's lowest and highest loss (the grid points within
        are kept).
    decided : float or None
        The loss where the query is decided (estimate), if there is a query.
    log_delta : float or None
        Log of the delta the query compares with (an estimate for a
        ``delta(epsilon)`` query).
    theta_low, theta_high : float or None
        Chernoff orders (relative to the tilt) that placed the window's edges;
        the composition's bounds at those edges use them (any order gives a
        valid bound).
    """

    tilt: float
    low: float
    high: float
    decided: float | None = None
    log_delta: float | None = None
    theta_low: float | None = None
    theta_high: float | None = None


def _scale(parts: Parts, t: float) -> float:
    var = sum(n * d.moments(t)[1] for d, n in parts)
    step = parts[0][0].step
    return max(math.sqrt(var), step)


#: Refinements of the search for a window edge's Chernoff order.
_QUANTILE_REFINEMENTS = 1


def _tail_quantiles(
    parts: Parts,
    tilt: float,
    tail: float,
    orders: tuple[float, float] | None = None,
) -> tuple[float, float, float, float]:
    """Losses outside which the tilted composition has at most ``tail`` per side.

    Returns ``(low, high, theta_low, theta_high)``: the quantiles and the
    Chernoff orders that gave them (kept for the composition's own bounds at
    the window's edges). ``orders``: ``(theta_low, theta_high)`` to use
    instead of searching (any orders of the right signs give valid
    quantiles).
    """
    base = _log_mgf_total(parts, np.array([tilt]))[0]
    log_inv = math.log(1.0 / tail)

    def upper(theta: np.ndarray) -> np.ndarray:
        return np.asarray(
            (_log_mgf_total(parts, tilt + theta) - base + log_inv) / theta
        )

    def lower_neg(theta: np.ndarray) -> np.ndarray:
        return np.asarray(
            -(_log_mgf_total(parts, tilt + theta) - base + log_inv) / theta
        )

    if orders is not None:
        th_lo, th_hi = orders
        both = upper(np.array([th_lo, th_hi]))
        return float(both[0]), float(both[1]), th_lo, th_hi
    scale = _scale(parts, tilt)
    # One refinement: an order within 8% of the best widens the window by a
    # fraction of a percent (the bound at the order's edge is still the tail:
    # the edge is placed by the order), where three cost 50% more points.
    th_hi, hi = _minimise(upper, scale, 1.0, _QUANTILE_REFINEMENTS)
    th_lo, lo = _minimise(lower_neg, scale, -1.0, _QUANTILE_REFINEMENTS)
    return -lo, hi, th_lo, th_hi


def plan(
    parts: Parts,
    *,
    delta: float | None = None,
    epsilon: float | None = None,
    level: float | None = None,
    floor: float | None = None,
    tail: float = _WINDOW_TAIL,
    partners: Parts = (),
    error_share: float | None = None,
) -> Plan:
    """Tilt and window for a query ``epsilon(delta)`` or ``delta(epsilon)``.

    Without a query the tilt is 0 and the window holds all but ``tail`` of
    the composition on each side (a plain, certified composition).

    Parameters
    ----------
    parts : sequence of (Dist, int)
        The PMFs and their counts (of the pessimistic side: their bins bound
        the composition's moment generating function).
    delta, epsilon : float, optional
        At most one: the query the composition answers.
    level : float, optional
        For ``epsilon(delta)``: tilt for this loss (a known lower value of the
        answer) instead of for the Chernoff estimate of the answer.
    floor : float, optional
        A loss the window must reach down to (a known lower value of the
        answer).
    tail : float, optional
        Tilted mass left outside the window on each side, without a query;
        with one, ``1e-4`` of the query's delta against the untilt factor at
        the deciding loss (within ``[1e-30, 1e-10]``).
    partners : sequence of (Dist, int), optional
        The other side's PMFs (optimistic), composed on the same plan: the
        window also holds all but ``tail`` of their tilted composition.
    error_share : float, optional
        With a query: the share of its delta the predicted FFT error may take
        where a smaller tilt than the Chernoff one gives a shorter transform
        (:func:`_cheapest_tilt`). None (default): the Chernoff tilt, the
        tightest bounds.

    Returns
    -------
    Plan
        The tilt, the window, and where (and against which delta) the query
        is decided.
    """
    lo_support = sum(n * d.min_loss for d, n in parts)
    hi_support = sum(n * d.max_loss for d, n in parts)
    tilt = 0.0
    decided: float | None = None
    log_delta: float | None = None
    s0 = _scale(parts, 0.0) if (delta, epsilon, level) != (None, None, None) else 1.0
    at = level if level is not None else epsilon
    if at is not None:
        eps = float(at)

        def exponent(lam: np.ndarray) -> np.ndarray:
            return np.asarray(_log_mgf_total(parts, lam) - lam * eps + _log_c(lam))

        lam, value = _minimise(exponent, s0, 1.0)
        base = float(_log_mgf_total(parts, np.array([0.0]))[0])
        tilt = lam if value < base else 0.0
        decided, log_delta = eps, min(value, base)
    elif delta is not None:
        rest = delta - _composed_infinity(parts, upward=True)
        if rest > 0:
            log_rest = math.log(rest)

            def estimate(lam: np.ndarray) -> np.ndarray:
                return np.asarray(
                    (_log_mgf_total(parts, lam) + _log_c(lam) - log_rest) / lam
                )

            tilt, decided = _minimise(estimate, s0, 1.0)
    if delta is not None:
        log_delta = math.log(delta)
    if decided is not None and log_delta is not None and tilt > 0 and error_share:
        tilt, tail, window = _cheapest_tilt(
            parts, partners, tilt, decided, log_delta, error_share
        )
    else:
        if decided is not None and log_delta is not None:
            tail = _query_tail(_log_untilt(parts, tilt, decided), log_delta)
        window = _window(parts, partners, tilt, tail)
    lo, hi, th_lo, th_hi = window
    if partners:
        lo_support = min(lo_support, sum(n * d.min_loss for d, n in partners))
        hi_support = max(hi_support, sum(n * d.max_loss for d, n in partners))
    if floor is not None:
        lo = min(lo, floor)
    if at is not None:
        lo = min(lo, float(at))
    lo = max(lo, lo_support)
    hi = min(max(hi, lo), hi_support)
    return Plan(tilt, lo, hi, decided, log_delta, th_lo, th_hi)


#: A window's lowest and highest loss and the Chernoff orders that placed them.
Window = tuple[float, float, float, float]


def _window(parts: Parts, partners: Parts, tilt: float, tail: float) -> Window:
    """:func:`_tail_quantiles` of ``parts``, widened to hold ``partners``'s too."""
    lo, hi, th_lo, th_hi = _tail_quantiles(parts, tilt, tail)
    if partners:
        # the optimistic side is the same loss law rounded the other way: the
        # orders found for the pessimistic side place its edges as well
        plo, phi, _, _ = _tail_quantiles(partners, tilt, tail, (th_lo, th_hi))
        lo, hi = min(lo, plo), max(hi, phi)
    return lo, hi, th_lo, th_hi


def _log_untilt(parts: Parts, tilt: float, decided: float) -> float:
    """``log U`` at the deciding loss: the untilt factor of a composition."""
    return float(_log_mgf_total(parts, np.array([tilt]))[0]) - tilt * decided


def _query_tail(log_u: float, log_delta: float) -> float:
    """Tilted mass a query's window may leave out on each side.

    Aliased and truncated tilted mass ``A`` returns as ``A U_j``: against the
    query's delta at the deciding loss (``log_u`` is ``log U`` there),
    ``1e-4`` of it is ample (within ``[1e-30, 1e-10]``); a narrower window is
    a faster one.
    """
    return min(max(math.exp(min(log_delta - log_u, 0.0)) * 1e-4, 1e-30), 1e-10)


#: Fractions of a query's Chernoff tilt tried for a shorter window.
_TILT_FRACTIONS = (1.0, 0.7, 0.5, 0.35, 0.25)

#: An FFT length below which a shorter window is not sought (its transforms
#: take about as long as the search for another tilt's window).
_SHORT_ENOUGH = 1 << 16


def _cheapest_tilt(
    parts: Parts,
    partners: Parts,
    tilt: float,
    decided: float,
    log_delta: float,
    share: float,
) -> tuple[float, float, Window]:
    """``(tilt, tail, window)``: the query's tilt, or a smaller one with a shorter FFT.

    The Chernoff tilt makes the error bound smallest at the deciding loss,
    but where one round's loss has a long right tail (a rare participation
    with a large loss) the tilted composition has one too, and the window
    that holds all but ``tail`` of it can be ten times the spread that
    decides the query. A smaller tilt shortens that tail; it raises the
    untilt factor ``U`` at the deciding loss, and so the error bound there.
    The fractions of the tilt in :data:`_TILT_FRACTIONS` are tried in turn,
    while each shortens the window (by a tenth at least) and its predicted
    double-precision error stays within ``share`` of the query's delta; the
    shortest FFT is used, the largest tilt among equals.
    Any tilt gives valid bounds; this trades a margin far below the query's
    tolerance for speed (random participation at 1e4 rounds: a 131 072-point
    transform instead of 524 288, the bracket's ends moved by 1e-5 of
    themselves).
    """
    h = parts[0][0].step
    longest = max(Mix.of(d).longest for d, _ in parts)
    if partners:
        longest = max(longest, max(Mix.of(d).longest for d, _ in partners))
    shortest = 1 << math.ceil(math.log2(max(longest, 2)))
    best: tuple[int, float, float, Window] | None = None
    previous = math.inf
    for fraction in _TILT_FRACTIONS:
        lam = tilt * fraction
        log_u = _log_untilt(parts, lam, decided)
        tail = _query_tail(log_u, log_delta)
        window = _window(parts, partners, lam, tail)
        lo, hi = min(window[0], decided), max(window[1], window[0])
        points = max(int((hi - lo) / h) + 2, longest, 2)
        if points > 0.9 * previous:
            break  # a smaller tilt no longer shortens the window
        previous = points
        length = 1 << math.ceil(math.log2(points))
        if best is not None:
            err = fft_error_factor(length) * _error_weight(parts, lam)
            if _log_error(err, log_u, lam, h, hi - decided) > log_delta + math.log(
                share
            ):
                break  # smaller tilts raise U further
        if best is None or length < best[0]:
            best = (length, lam, tail, window)
        if length <= max(shortest, _SHORT_ENOUGH):
            break  # the shortest transform that holds one round, or a cheap one
    assert best is not None
    return best[1], best[2], best[3]


def _error_weight(parts: Parts, lam: float) -> float:
    """``sum_p n_p sum_j a_j k_j ||x~_j||_2`` at tilt ``lam``.

    The FFT error bound of :func:`compose` is about ``eta_L`` times this (its
    forward-transform term, the dominant one).
    """
    total = 0.0
    for d, n in parts:
        mix = Mix.of(d)
        logs, norms = [], []
        for w, dj, k in mix.terms:
            loss = (dj.offset + np.arange(dj.size)) * dj.step
            with np.errstate(divide="ignore"):
                lw = np.log(dj.probs) + lam * loss
            top = float(np.max(lw))
            with np.errstate(under="ignore"):
                e = np.exp(lw - top)
            kappa = top + math.log(float(np.sum(e)))
            log_n2 = top + 0.5 * math.log(float(np.dot(e, e))) - kappa
            logs.append(math.log(w) + k * kappa)
            norms.append(k * math.exp(log_n2))
        if mix.rest > 0:
            logs.append(math.log(mix.rest))
            norms.append(0.0)
        peak = max(logs)
        z = sum(math.exp(v - peak) for v in logs)
        total += n * sum(math.exp(v - peak) / z * m for v, m in zip(logs, norms))
    return total


#: Predicted double-precision error, against the query's delta, above which
#: :func:`compose` works in long double.
_EXTEND_ABOVE = 1e-3


def _log_error(err: float, log_u: float, lam: float, h: float, above: float) -> float:
    """Log of an FFT error ``err`` (tilted 2-norm) as it returns in delta.

    The error comes back as ``U_j`` times itself at each loss; summed over the
    tail above the deciding loss (Cauchy-Schwarz), where ``log_u`` is ``log
    U`` at the deciding loss and ``above`` the window's extent above it.
    """
    if err <= 0:
        return -math.inf
    if lam > 0:
        spread = 1.0 / math.sqrt(-math.expm1(-2.0 * lam * h))
    else:
        spread = math.sqrt(max(above, h) / h)
    return math.log(err * spread) + log_u


def _index_window(parts: Parts, p: Plan) -> tuple[int, int, int, int, int]:
    """``(a, top, L, first, last)``: window, FFT length and support (grid indices).

    Indices are absolute (loss / step): ``[a, top]`` is the output window,
    ``[first, last]`` the composition's support.
    """
    h = parts[0][0].step
    first = sum(n * d.offset for d, n in parts)
    last = sum(n * (d.offset + d.size - 1) for d, n in parts)
    a = min(max(int(math.floor(p.low / h + 1e-9)), first), last)
    top = min(max(int(math.ceil(p.high / h - 1e-9)), a), last)
    longest = max(Mix.of(d).longest for d, _ in parts)
    length = 1 << max(1, math.ceil(math.log2(max(top - a + 1, longest, 2))))
    if a + length - 1 > last:
        a = max(first, last - length + 1)
    top = min(a + length - 1, last)
    return a, top, length, first, last


def window_length(parts: Parts, p: Plan) -> int:
    """FFT length (a power of two) that :func:`compose` will use."""
    return _index_window(parts, p)[2]


def _chernoff_log(
    parts: Parts, shift: float, base: float, at: float, sign: float
) -> float:
    """Log of a Chernoff bound: mass at ``sign * (loss - at) >= 0``.

    Of the composition tilted by ``shift`` and normalised by ``exp(base)``.
    """
    scale = _scale(parts, shift)

    def f(theta: np.ndarray) -> np.ndarray:
        return _log_mgf_total(parts, shift + theta) - base - theta * at

    return _minimise(f, scale, sign)[1]


def _edge_log(
    parts: Parts,
    shift: float,
    base: float,
    at: float,
    theta: float | None,
    sign: float,
) -> float:
    """Chernoff bound (log) at one window edge: at ``theta`` if it has the sign.

    The order that placed the edge is close to optimal there; any order of
    the right sign gives a valid bound. Without one, it is searched.
    """
    if theta is not None and theta * sign > 0:
        value = float(_log_mgf_total(parts, np.array([shift + theta]))[0])
        return value - base - theta * at
    return _chernoff_log(parts, shift, base, at, sign)


def compose(parts: Parts, p: Plan, *, extended: bool | None = None) -> CertifiedPmf:
    """The composition of ``parts`` on ``p``'s window, as a certified envelope.

    Parameters
    ----------
    parts : sequence of (Dist, int)
        PMFs on one grid, all pessimistic or all optimistic, and their counts.
    p : Plan
        Tilt and window (:func:`plan`).
    extended : bool or None, optional
        Compute the forward transforms and their powers in numpy's long
        double (80-bit on x86: unit roundoff ``2^-64``), the inverse in
        double. Slower (about five times for those steps), but the error
        bound then falls from about ``sum_i n_i eta_L ||x~_i||_2`` to about
        ``eta_L ||y~||_2``, far smaller when a concentrated one-round PMF is
        composed many times. Where long double is double, nothing changes.
        None (default): long double when the double-precision bound,
        predicted at the plan's deciding loss, exceeds ``1e-3`` of its delta.

    Returns
    -------
    dp_accounting.pld.pld_pmf.DensePLDPmf
        Pessimistic inputs: a PMF whose masses are upper bounds on the true
        composition's at every loss of the window (mass below it on its
        lowest loss, mass above it at +infinity). Optimistic inputs: lower
        bounds, mass outside the window dropped. See the module docstring.
    """
    mixes = [(Mix.of(d), n) for d, n in parts]
    parts = mixes
    h = parts[0][0].step
    pess = parts[0][0].pessimistic
    for mix, _ in mixes:
        for _, d, _ in mix.terms:
            if not math.isclose(d.step, h, rel_tol=1e-12) or d.pessimistic != pess:
                raise ValueError("compose needs PMFs on one grid and of one kind")
    a, top, length, first_index, last = _index_window(parts, p)
    lam = p.tilt
    eta = fft_error_factor(length)
    sq = math.sqrt(length)
    kappa_total = 0.0
    tau = 0.0
    log_cap = 0.0
    entries = 0
    # per part: its count, rest weight and, per term, (log weight, power,
    # tilted PMF, its offset, tilted mass, 2-norm)
    prepared = []
    for mix, n in mixes:
        terms = []
        part_tau = 0.0
        for w, d, k in mix.terms:
            loss = (d.offset + np.arange(d.size)) * h
            with np.errstate(divide="ignore"):
                logp = np.log(d.probs)
            lw = logp + lam * loss
            top_w = float(np.max(lw))
            with np.errstate(under="ignore"):
                kappa = top_w + math.log(float(np.sum(np.exp(lw - top_w))))
                xt = np.exp(lw - kappa)
            finite = np.isfinite(logp)
            mag = float(np.max((np.abs(logp) + np.abs(lam * loss))[finite]))
            part_tau = max(part_tau, k * 2.0 * UNIT_ROUNDOFF * (mag + abs(kappa) + 2.0))
            m_i = float(np.sum(xt)) * (1.0 + (d.size + 1) * UNIT_ROUNDOFF)
            n2 = math.sqrt(float(np.sum(xt * xt))) * (
                1.0 + (d.size + 1) * UNIT_ROUNDOFF
            )
            terms.append((math.log(w) + k * kappa, k, xt, d.offset, m_i, n2))
            entries += d.size
        # normalise the tilted round: Z = rest + sum_j w_j e^{k_j kappa_j} m_j^k_j
        logs = [lz + k * math.log(m) for lz, k, _, _, m, _ in terms]
        if mix.rest > 0:
            logs.append(math.log(mix.rest))
        top_l = max(logs)
        log_z = top_l + math.log(sum(math.exp(v - top_l) for v in logs))
        kappa_total += n * log_z
        tau += n * (part_tau + 4.0 * UNIT_ROUNDOFF * (len(terms) + 1))
        log_cap += n * math.log(mix.mass) if mix.mass > 0 else -math.inf
        prepared.append((n, mix.rest, log_z, terms))
    if extended is None:
        extended = _EXTENDED and _worth_extending(prepared, p, h, eta, kappa_total)
    work = np.longdouble if extended else np.float64
    u_work = float(np.finfo(work).eps) / 2.0
    eta_work = FFT_CONSTANT * u_work * max(1.0, math.log2(max(length, 2)))
    freq = np.arange(length // 2 + 1, dtype=np.int64)
    spectrum: np.ndarray | None = None
    log_pr = 0.0  # log prod R_p^{n_p}
    rel = 0.0  # sum over parts of their relative spatial error (before inverse)
    for n, rest, log_z, terms in prepared:
        a_rest = math.exp(math.log(rest) - log_z) if rest > 0 else 0.0
        big_r = a_rest
        fwd = power_err = 0.0
        f_round: np.ndarray | None = None
        for lz, k, xt, offset, m_i, n2 in terms:
            a_j = math.exp(lz - log_z)
            big_m = m_i + eta_work * sq * n2
            big_r += a_j * big_m**k
            fwd += a_j * k * big_m ** (k - 1) * n2
            power_err += a_j * ((12.0 * k + 8.0 if k > 1 else 0.0) + 4.0) * big_m**k
            f = sp_fft.rfft(xt.astype(work), length)
            shift = (k * offset) % length
            with np.errstate(divide="ignore", under="ignore"):
                # f**k in polar form (about twice as fast as numpy's complex
                # power), moved to the absolute grid by the phase of the shift
                angle = k * np.angle(f) if k > 1 else np.angle(f)
                angle = angle - (2.0 * np.pi / length) * ((freq * shift) % length)
                mag = np.exp(k * np.log(np.abs(f))) if k > 1 else np.abs(f)
                f = (a_j * mag) * np.exp(1j * angle)
            f_round = f if f_round is None else f_round + f
            del f
        assert f_round is not None
        if a_rest > 0:
            f_round = f_round + a_rest
        power_err += (len(terms) + 1) * big_r
        if n > 1:
            with np.errstate(divide="ignore", under="ignore"):
                f_round = np.exp(n * np.log(np.abs(f_round))) * np.exp(
                    1j * (n * np.angle(f_round))
                )
        spectrum = f_round if spectrum is None else spectrum * f_round
        del f_round
        log_pr += n * math.log(big_r)
        rel += (n / big_r) * (eta_work * fwd + u_work * power_err)
        rel += u_work * (12.0 * n + 8.0 if n > 1 else 0.0)
    assert spectrum is not None
    rel += 3.0 * u_work * (len(prepared) - 1)
    conv = sp_fft.irfft(spectrum.astype(np.complex128), length)
    del spectrum
    # the 2-norm of the computed circular result (rounded up)
    norm = math.sqrt(float(np.dot(conv, conv))) * (1.0 + length * UNIT_ROUNDOFF)
    out = np.roll(conv, -(a % length))[: top - a + 1]
    del conv
    # errors before the inverse transform, in the spatial 2-norm
    first = math.exp(log_pr) * rel
    if extended:
        first += UNIT_ROUNDOFF * (norm + first)  # rounding to complex128
    # the inverse adds eta (||y~_c|| + first), ||y~_c|| <= norm + err: solved
    slack = 1.0 - eta
    err = (first * (1.0 + eta) + eta * norm) / slack * 1.01
    tau *= 1.01
    # aliasing: tilted mass outside [a, top]
    base = kappa_total
    lo_loss = a * h
    hi_loss = top * h
    alias = 0.0
    if a > first_index:
        alias += math.exp(_edge_log(parts, lam, base, lo_loss - h, p.theta_low, -1.0))
    if top < last:
        alias += math.exp(_edge_log(parts, lam, base, hi_loss + h, p.theta_high, 1.0))
    alias *= (1.0 + tau) * 1.01
    err += _UNDERFLOW * entries
    widest = max(abs(lo_loss), abs(hi_loss))
    rho = 2.0 * UNIT_ROUNDOFF * (abs(kappa_total) + abs(lam) * widest + 4.0)
    rho += tau
    cap = math.exp(min(log_cap, 700.0))
    lump = 0.0
    if pess:
        inf_mass = _composed_infinity(parts, upward=True)
        # untilted: the orders shifted by the tilt, where of the right sign
        th_lo = None if p.theta_low is None else lam + p.theta_low
        th_hi = None if p.theta_high is None else lam + p.theta_high
        if a > first_index:
            below = _edge_log(parts, 0.0, 0.0, lo_loss - h, th_lo, -1.0)
            lump = min(cap, math.exp(min(below, 700.0)) * 1.01)
        if top < last:
            above = _edge_log(parts, 0.0, 0.0, hi_loss + h, th_hi, 1.0)
            inf_mass = min(1.0, inf_mass + math.exp(min(above, 0.0)) * 1.01)
    else:
        inf_mass = _composed_infinity(parts, upward=False)
    return CertifiedPmf(
        h,
        a,
        out,
        inf_mass,
        pess,
        kappa=kappa_total,
        tilt=lam,
        error=err,
        alias=alias,
        rho=rho,
        cap=cap,
        lump=lump,
    )


#: Whether numpy's long double is more precise than double here (x86: 80-bit).
_EXTENDED = bool(np.finfo(np.longdouble).eps < np.finfo(np.float64).eps)


def _worth_extending(
    prepared: list[Any], p: Plan, h: float, eta: float, kappa: float
) -> bool:
    """Whether the double-precision error bound would matter for the query.

    The dominant term of the bound, ``eta sum n a_j k_j ||x~_j||_2``, returned
    to delta (:func:`_log_error`), is compared with ``1e-3`` of the query's
    delta. Only a prediction: the readings use the bound itself.
    """
    if p.decided is None or p.log_delta is None:
        return False
    err = 0.0
    for n, _, log_z, terms in prepared:
        for lz, k, _, _, _, n2 in terms:
            err += n * math.exp(lz - log_z) * k * n2
    log_u = kappa - p.tilt * p.decided
    above = p.high - p.decided
    return _log_error(eta * err, log_u, p.tilt, h, above) > p.log_delta + math.log(
        _EXTEND_ABOVE
    )
