"""Privacy-loss distributions with certified upper and lower bounds.

dp_accounting is the engine (its :class:`PrivacyLossDistribution`, PMFs and
FFT composition); this module adds what it lacks:

* exact hockey-stick divergences of *label mixtures of pairs of finite
  Gaussian mixtures with a common standard deviation* (:class:`MixturePair`),
  integrating the positive part over every interval between roots;
* PLDs built from such pairs in both directions, pessimistic (connect-the-dots
  on a non-uniform set of grid points, Doroshenko et al. 2022, Alg. 1) and
  optimistic (a garbling of the true pair with losses on the grid), see
  :func:`pld_from_label_mixture`;
* :func:`pld_from_delta_curve` for any scheme whose hockey-stick curves are
  known;
* certified composition (:func:`self_compose`, :func:`bracket_parts`): an
  exponentially tilted FFT whose round-off and truncation are bounded a
  priori (:mod:`dpfl.accounting.tilted`), tilted for the query so that the
  bounds hold at every delta down to the smallest, with a memory cap
  (:data:`MAX_COMPOSED_POINTS`: past it, the one round is rebuilt, or
  rebinned, on a coarser grid with sound rounding), and the bracketing
  helpers :func:`compose_bounds`, :func:`epsilon_bound`, :func:`delta_bound`,
  :func:`refine_bound` and :func:`refine_parts`.

Conventions (dp_accounting's): ``pmf_remove`` is the PLD of
``(P, Q) = (M(D), M(D'))`` where ``D'`` has one record less, i.e. P is the
output distribution *with* the record; ``pmf_add`` is the PLD of ``(Q, P)``.
``delta(epsilon)`` of a PLD is the maximum over the two directions.

Roots. The integrand ``sum_k c_k phi_sigma(z - m_k)`` has at most as many
real roots as its coefficient sequence (ordered by mean) has sign changes,
because ``exp(m z / sigma^2)`` is a totally positive kernel (Descartes' rule
for exponential sums). :func:`_roots` finds all of them by a recursion of that
depth: for S sign changes, multiplying by ``exp(-mu z / sigma^2)`` with ``mu``
between the first two sign blocks and differentiating leaves exactly S - 1
sign changes, whose roots separate the roots of the original function.

Soundness of the two discretisations.

* Upper: connect-the-dots with support points ``eps_1 < ... < eps_n`` (any
  subset of the grid) and the exact ``delta(eps_j)`` gives a pair that
  dominates the true one (its hockey-stick curve is the chord interpolation
  of the convex curve ``e^eps -> delta``), so composition stays an upper
  bound. Mass above the last point goes to +infinity.
* Lower: merging every output whose privacy loss lies in
  ``(eps_j, eps_{j+1}]`` is a post-processing, so the merged pair is dominated
  by the true one. A second, randomised post-processing then moves every
  merged loss exactly onto a grid point (see :func:`_garbled_grid_probs`),
  and a merged output that the outputs just above it cannot lift to the next
  grid point is rounded down; mass below the lowest point is dropped. Every
  loss ends at most where it was, and ``delta(eps)`` of one round and of any
  composition is non-decreasing in every loss, so the composition's delta is
  a lower bound; its error is second order in the gaps, like the upper
  bound's, except for the outputs rounded down.
"""

from __future__ import annotations

import contextvars
import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from dp_accounting.pld import pld_pmf
from dp_accounting.pld.privacy_loss_distribution import PrivacyLossDistribution
from scipy import special

from dpfl._validate import (
    check_count,
    check_delta,
    check_nonnegative,
    check_positive,
    check_probability,
)
from dpfl.accounting import tilted
from dpfl.accounting.bounds import Bound
from dpfl.errors import InvalidParameterError

__all__ = [
    "LossTailTooHeavy",
    "MAX_COMPOSED_POINTS",
    "BracketResult",
    "MixturePair",
    "MixturePart",
    "bracket_parts",
    "common_step",
    "compose_bounds",
    "delta_bound",
    "epsilon_bound",
    "label_candidates_delta",
    "label_mixture_delta",
    "mixture_hockey_stick",
    "pmf_delta_for_epsilon",
    "pmf_epsilon_for_delta",
    "label_sup_delta",
    "pld_bounds_from_curves",
    "pld_bounds_from_label_mixture",
    "pld_from_delta_curve",
    "pld_from_label_mixture",
    "public_mixture",
    "refine_bound",
    "refine_parts",
    "self_compose",
    "start_discretization",
]

_MAX_POINTS = 4_000_000  # one-round PMF size cap per direction


# --------------------------------------------------------------------------
# Gaussian-mixture pairs and their exact hockey-stick divergence
# --------------------------------------------------------------------------


class LossTailTooHeavy(InvalidParameterError):
    """One round's privacy loss keeps more than the tail mass beyond e^670.

    Too little noise for the sampling: no discretised PLD can hold the loss,
    and the certified answer is the trivial one (ε = ∞, δ = 1).
    """


@dataclasses.dataclass(frozen=True)
class MixturePair:
    """A pair of finite Gaussian mixtures on the line with a common std.

    ``P = sum_k weights_p[k] N(means[k], sigma^2)`` (the output *with* the
    record) and ``Q = sum_k weights_q[k] N(means[k], sigma^2)`` (without it).
    Equal means are merged and zero-weight components dropped on creation.

    Attributes
    ----------
    means : numpy.ndarray
        Distinct component means, sorted increasingly.
    weights_p, weights_q : numpy.ndarray
        Non-negative component weights of P and Q, each summing to 1.
    weights_diff : numpy.ndarray
        ``weights_p - weights_q`` computed before merging (exact zeros for
        components common to P and Q), used to avoid cancellation.
    """

    means: np.ndarray
    weights_p: np.ndarray
    weights_q: np.ndarray
    weights_diff: np.ndarray

    @classmethod
    def create(
        cls,
        means: Sequence[float] | np.ndarray,
        weights_p: Sequence[float] | np.ndarray,
        weights_q: Sequence[float] | np.ndarray,
    ) -> MixturePair:
        """Return a normalised pair, merging equal means.

        Parameters
        ----------
        means : sequence of float
            Component means (may repeat).
        weights_p, weights_q : sequence of float
            Non-negative weights of P and Q on those means; each must sum to 1
            within 1e-9.

        Returns
        -------
        MixturePair
            The pair with distinct sorted means.

        Raises
        ------
        InvalidParameterError
            If shapes differ, a weight is negative or not finite, or a mixture
            does not sum to 1.
        """
        m = np.asarray(means, dtype=float).ravel()
        a = np.asarray(weights_p, dtype=float).ravel()
        b = np.asarray(weights_q, dtype=float).ravel()
        if not (m.shape == a.shape == b.shape) or m.size == 0:
            raise InvalidParameterError(
                "means, weights_p and weights_q must be non-empty and of equal "
                f"length; got {m.size}, {a.size}, {b.size}"
            )
        if not (np.all(np.isfinite(m)) and np.all(np.isfinite(a))):
            raise InvalidParameterError("means and weights must be finite")
        if np.any(a < 0) or np.any(b < 0) or not np.all(np.isfinite(b)):
            raise InvalidParameterError("mixture weights must be >= 0 and finite")
        for name, w in (("weights_p", a), ("weights_q", b)):
            if abs(math.fsum(w) - 1.0) > 1e-9:
                raise InvalidParameterError(
                    f"{name} must sum to 1; got {math.fsum(w)!r}"
                )
        uniq, inv = np.unique(m, return_inverse=True)
        ap = np.zeros(uniq.size)
        bq = np.zeros(uniq.size)
        diff = np.zeros(uniq.size)
        np.add.at(ap, inv, a)
        np.add.at(bq, inv, b)
        np.add.at(diff, inv, a - b)
        keep = (ap > 0) | (bq > 0)
        return cls(uniq[keep], ap[keep], bq[keep], diff[keep])

    def swapped(self) -> MixturePair:
        """Return the pair ``(Q, P)`` (the add direction)."""
        return MixturePair(
            self.means, self.weights_q, self.weights_p, -self.weights_diff
        )


def _lse(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """Log-sum-exp along ``axis`` that returns -inf for all -inf rows."""
    mx = np.max(x, axis=axis, keepdims=True)
    safe = np.where(np.isfinite(mx), mx, 0.0)
    with np.errstate(divide="ignore", invalid="ignore", under="ignore"):
        s = np.sum(np.exp(x - safe), axis=axis, keepdims=True)
        out = np.log(s) + safe
    out = np.where(np.isfinite(mx), out, -np.inf)
    return np.squeeze(out, axis=axis)


def _log_parts(
    z: np.ndarray, logc: np.ndarray, sgn: np.ndarray, m: np.ndarray, s: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Logs of the positive and negative parts of ``h(z)``.

    ``h(z) = sum_k c_k exp(m_k s z - m_k^2 s / 2)``.

    Also returns the derivatives of both logs with respect to z.
    """
    expo = logc + m * s * z[:, None] - 0.5 * s * m * m
    pos = np.where(sgn > 0, expo, -np.inf)
    neg = np.where(sgn < 0, expo, -np.inf)
    lp = _lse(pos)
    ln = _lse(neg)
    m = np.broadcast_to(m, expo.shape)
    with np.errstate(invalid="ignore", over="ignore", under="ignore"):
        wp = np.exp(pos - np.where(np.isfinite(lp), lp, 0.0)[:, None])
        wn = np.exp(neg - np.where(np.isfinite(ln), ln, 0.0)[:, None])
    dp = np.sum(wp * m * s, axis=1)
    dn = np.sum(wn * m * s, axis=1)
    return lp, ln, dp, dn


def _sign_at(
    z: np.ndarray, logc: np.ndarray, sgn: np.ndarray, m: np.ndarray, s: float
) -> np.ndarray:
    lp, ln, _, _ = _log_parts(z, logc, sgn, m, s)
    return np.sign(np.where(np.isfinite(lp) | np.isfinite(ln), lp - ln, 0.0)).astype(
        float
    )


def _solve_bracketed(
    lo: np.ndarray,
    hi: np.ndarray,
    logc: np.ndarray,
    sgn: np.ndarray,
    m: np.ndarray,
    s: float,
) -> np.ndarray:
    """Root of ``h`` in ``[lo, hi]`` (rows where ``h(lo), h(hi)`` differ in sign).

    Safeguarded Newton (``rtsafe``) on ``g = log h_+ - log h_-``: a Newton step
    is taken when it stays inside the bracket and halves the previous step,
    otherwise the bracket is bisected. Rows leave the iteration once the step
    is below ~1e-13 relative.
    """
    lo = np.array(lo, dtype=float)
    hi = np.array(hi, dtype=float)
    m = np.broadcast_to(m, logc.shape)
    s_lo = _sign_at(lo, logc, sgn, m, s)
    z = 0.5 * (lo + hi)
    dx_old = hi - lo
    act = np.arange(z.size)
    for _ in range(300):
        if act.size == 0:
            break
        za, la, ha = z[act], lo[act], hi[act]
        lp, ln, dp, dn = _log_parts(za, logc[act], sgn[act], m[act], s)
        g = lp - ln
        dg = dp - dn
        sg = np.sign(g)
        same = sg == s_lo[act]
        la = np.where(same, za, la)
        ha = np.where(same, ha, za)
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            dx = g / dg
            step = za - dx
        newton = (
            np.isfinite(step)
            & (step > la)
            & (step < ha)
            & (np.abs(2.0 * dx) <= np.abs(dx_old[act]))
        )
        z_new = np.where(newton, step, 0.5 * (la + ha))
        z_new = np.where(sg == 0, za, z_new)
        dx_new = np.abs(z_new - za)
        tol = 1e-13 * np.maximum(1.0, np.abs(za))
        done = (sg == 0) | (dx_new <= tol) | (ha - la <= tol)
        z[act], lo[act], hi[act] = z_new, la, ha
        dx_old[act] = np.where(newton, dx_new, ha - la)
        act = act[~done]
    return np.asarray(z)


def _sign_blocks(sgn: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Sign changes per row; last index of the first sign block; first of the second."""
    n, k = sgn.shape
    nz = sgn != 0
    # sign changes: compare each non-zero entry with the previous non-zero one
    filled = np.where(nz, sgn, 0.0)
    last = np.zeros(n)
    changes = np.zeros(n, dtype=int)
    second_start = np.full(n, -1)
    first_end = np.full(n, -1)
    for j in range(k):
        col = filled[:, j]
        is_change = (col != 0) & (last != 0) & (col != last)
        new_second = is_change & (second_start < 0)
        second_start = np.where(new_second, j, second_start)
        changes += is_change
        update_first_end = (col != 0) & (second_start < 0)
        first_end = np.where(update_first_end, j, first_end)
        last = np.where(col != 0, col, last)
    return changes, first_end, second_start


def _outer_brackets(
    logc: np.ndarray, sgn: np.ndarray, m: np.ndarray, s: float
) -> tuple[np.ndarray, np.ndarray]:
    """Points beyond which the extreme-mean term dominates (rigorous)."""
    n, k = sgn.shape
    nz = sgn != 0
    cnt = np.maximum(nz.sum(axis=1), 2)
    bot = np.argmax(nz, axis=1)
    top = k - 1 - np.argmax(nz[:, ::-1], axis=1)
    rows = np.arange(n)
    lc = np.where(nz, logc, -np.inf)
    log_cnt = np.log(cnt - 1.0)[:, None]
    mt = m[rows, top][:, None]
    mb = m[rows, bot][:, None]
    with np.errstate(invalid="ignore", divide="ignore"):
        zt = (lc + log_cnt - logc[rows, top][:, None]) / ((mt - m) * s) + 0.5 * (mt + m)
        zt = np.where(nz & (m < mt), zt, -np.inf)
        zb = (0.5 * (mb + m)) - (lc + log_cnt - logc[rows, bot][:, None]) / (
            (m - mb) * s
        )
        zb = np.where(nz & (m > mb), zb, np.inf)
    upper = np.max(zt, axis=1)
    lower = np.min(zb, axis=1)
    upper = np.where(np.isfinite(upper), upper, mt[:, 0]) + 1.0
    lower = np.where(np.isfinite(lower), lower, mb[:, 0]) - 1.0
    return lower, upper


def _roots(logc: np.ndarray, sgn: np.ndarray, m: np.ndarray, s: float) -> np.ndarray:
    """All sign-changing real roots of an exponential sum, row by row.

    ``h(z) = sum_k sgn_k exp(logc_k) exp(m_k s z - m_k^2 s / 2)``.

    Rows are independent problems on the common sorted means ``m``. Returns an
    ``(n, S)`` array, S the largest number of sign changes, sorted per row and
    padded with NaN.
    """
    n = sgn.shape[0]
    changes, first_end, second_start = _sign_blocks(sgn)
    smax = int(changes.max()) if n else 0
    if smax >= sgn.shape[1]:  # impossible for finite inputs; guards recursion
        raise InvalidParameterError("non-finite mixture coefficients")
    if smax == 0:
        return np.empty((n, 0))
    # Critical points of h * exp(-mu s z), mu between the first two sign blocks:
    # its derivative has coefficients c_k (m_k - mu) with exactly S - 1 changes.
    has = changes >= 1
    fe = np.where(has, first_end, 0)
    ss = np.where(has, second_start, 0)
    rows_all = np.arange(n)
    mu = 0.5 * (m[rows_all, fe] + m[rows_all, ss])
    diff = m - mu[:, None]
    with np.errstate(divide="ignore"):
        logc_d = logc + np.log(np.abs(diff))
    sgn_d = sgn * np.sign(diff)
    sgn_d = np.where(has[:, None], sgn_d, 0.0)
    if smax >= 2:
        crit = _roots(logc_d, sgn_d, m, s)
    else:
        crit = np.empty((n, 0))
    lower, upper = _outer_brackets(logc, sgn, m, s)
    # interval endpoints: [-inf, crit..., +inf]; NaN crit -> +inf (empty interval)
    crit = np.where(np.isnan(crit), np.inf, crit)
    crit = np.sort(crit, axis=1)
    edges = np.concatenate([np.full((n, 1), -np.inf), crit, np.full((n, 1), np.inf)], 1)
    roots = np.full((n, edges.shape[1] - 1), np.nan)
    for j in range(edges.shape[1] - 1):
        a = edges[:, j]
        b = edges[:, j + 1]
        valid = has & (a < b)
        if not valid.any():
            continue
        lo = np.where(
            np.isinf(a), np.minimum(lower, np.where(np.isinf(b), lower, b)), a
        )
        hi = np.where(
            np.isinf(b), np.maximum(upper, np.where(np.isinf(a), upper, a)), b
        )
        rows = np.nonzero(valid)[0]
        slo = _sign_at(lo[rows], logc[rows], sgn[rows], m[rows], s)
        shi = _sign_at(hi[rows], logc[rows], sgn[rows], m[rows], s)
        at_lo = slo == 0
        brack = (slo * shi < 0) & ~at_lo
        r = np.full(rows.size, np.nan)
        if brack.any():
            rb = rows[brack]
            r[brack] = _solve_bracketed(lo[rb], hi[rb], logc[rb], sgn[rb], m[rb], s)
        r[at_lo & np.isfinite(lo[rows]) & (shi != 0)] = lo[rows][
            at_lo & np.isfinite(lo[rows]) & (shi != 0)
        ]
        roots[rows, j] = r
    roots = np.sort(roots, axis=1)  # NaN last
    width = max(smax, 1)
    return roots[:, :width]


def _hockey_rows(
    m: np.ndarray,
    a: np.ndarray,
    b: np.ndarray,
    diff: np.ndarray,
    eps: np.ndarray,
    sigma: float,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Row-wise ``(delta, P(S), Q(S), P(not S))`` for ``S = {P > e^eps Q}``.

    Every argument has shape ``(n, K)`` except ``eps`` (shape ``(n,)``).

    Each row's means must be sorted increasingly (components with zero
    weight in both P and Q may repeat means).
    """
    n = eps.size
    s = 1.0 / (sigma * sigma)
    x = np.exp(eps)[:, None]
    # c_k = a_k - x b_k. Near eps = 0 (x ~ 1) it is formed as
    # x (a_k - b_k) - a_k (x - 1), which keeps a_k ~ b_k from cancelling; for
    # large eps that form cancels instead (a component absent from Q, b_k = 0,
    # gives x a_k - a_k (x - 1): at eps ~ 38 the a_k is lost below the ulp of
    # x a_k), so there c_k is formed directly.
    small = (eps <= 1.0)[:, None]
    with np.errstate(over="ignore", invalid="ignore"):
        c = np.where(small, diff * x - a * np.expm1(eps)[:, None], a - x * b)
    c = np.where(np.isfinite(c), c, 0.0)
    sgn = np.sign(c)
    with np.errstate(divide="ignore"):
        logc = np.log(np.abs(c))
    roots = _roots(logc, sgn, m, s)
    nz = sgn != 0
    top = m.shape[1] - 1 - np.argmax(nz[:, ::-1], axis=1)
    top_sign = np.where(nz.any(axis=1), sgn[np.arange(n), top], -1.0)
    r = roots
    nroot = np.sum(~np.isnan(r), axis=1)
    p_mass = np.zeros(n)
    q_mass = np.zeros(n)
    p_out = np.zeros(n)
    delta = np.zeros(n)
    k = r.shape[1]
    # interval t = (r_{t-1}, r_t), r_{-1} = -inf and r_{nroot} = +inf; its
    # sign is top_sign * (-1)^(nroot - t) (roots are sign changes).
    for t in range(k + 1):
        left = np.full(n, -np.inf) if t == 0 else r[:, t - 1]
        right = r[:, t] if t < k else np.full(n, np.inf)
        right = np.where(t == nroot, np.inf, right)
        sign = top_sign * np.where((nroot - t) % 2 == 0, 1.0, -1.0)
        active = t <= nroot
        use = active & (sign > 0)
        out = active & ~(sign > 0)
        if out.any():
            rows = np.nonzero(out)[0]
            mass = _interval_mass_rows(left[rows], right[rows], m[rows], sigma)
            p_out[rows] += np.sum(mass * a[rows], axis=1)
        if not use.any():
            continue
        rows = np.nonzero(use)[0]
        mass = _interval_mass_rows(left[rows], right[rows], m[rows], sigma)
        p_mass[rows] += np.sum(mass * a[rows], axis=1)
        q_mass[rows] += np.sum(mass * b[rows], axis=1)
        delta[rows] += np.sum(mass * c[rows], axis=1)
    return (
        np.maximum(delta, 0.0),
        np.minimum(p_mass, 1.0),
        np.minimum(q_mass, 1.0),
        np.minimum(p_out, 1.0),
    )


def _interval_mass_rows(
    a: np.ndarray, b: np.ndarray, m: np.ndarray, sigma: float
) -> np.ndarray:
    """``P(a < Z < b)`` for ``Z ~ N(m_rk, sigma^2)``, accurate in both tails."""
    za = (a[:, None] - m) / sigma
    zb = (b[:, None] - m) / sigma
    with np.errstate(invalid="ignore"):
        up = special.ndtr(-za) - special.ndtr(-zb)
        dn = special.ndtr(zb) - special.ndtr(za)
    return np.asarray(np.maximum(np.where(za > 0, up, dn), 0.0))


def mixture_hockey_stick(
    pair: MixturePair, epsilons: np.ndarray | Sequence[float], *, noise_std: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Exact hockey-stick divergence ``D_{e^eps}(P || Q)`` of a Gaussian-mixture pair.

    The positive part of ``P - e^eps Q`` is integrated over every interval
    between its roots (all of them, see the module docstring) with normal
    tail probabilities taken on the accurate side.

    Parameters
    ----------
    pair : MixturePair
        The pair ``(P, Q)``.
    epsilons : array_like
        Real values of epsilon (any sign).
    noise_std : float
        Common standard deviation sigma of all components.

    Returns
    -------
    delta : numpy.ndarray
        ``integral (P - e^eps Q)_+``.
    p_mass, q_mass : numpy.ndarray
        ``P(S)`` and ``Q(S)`` for ``S = {P > e^eps Q}``, so that
        ``delta = p_mass - e^eps q_mass``.
    """
    eps = np.atleast_1d(np.asarray(epsilons, dtype=float))
    n = eps.size
    shape = (n, pair.means.size)
    d, pm, qm, _ = _hockey_rows(
        np.broadcast_to(pair.means, shape),
        np.broadcast_to(pair.weights_p, shape),
        np.broadcast_to(pair.weights_q, shape),
        np.broadcast_to(pair.weights_diff, shape),
        eps,
        float(noise_std),
    )
    return d, pm, qm


Labels = Sequence[tuple[float, MixturePair]]


def _stack_labels(labels: Labels) -> tuple[np.ndarray, ...]:
    kmax = max(pr.means.size for _, pr in labels)
    nl = len(labels)
    m = np.zeros((nl, kmax))
    a = np.zeros((nl, kmax))
    b = np.zeros((nl, kmax))
    df = np.zeros((nl, kmax))
    w = np.zeros(nl)
    for i, (wt, pr) in enumerate(labels):
        k = pr.means.size
        m[i, :k] = pr.means
        m[i, k:] = pr.means[-1]
        a[i, :k] = pr.weights_p
        b[i, :k] = pr.weights_q
        df[i, :k] = pr.weights_diff
        w[i] = wt
    return w, m, a, b, df


def label_mixture_delta(
    labels: Labels,
    epsilons: np.ndarray | Sequence[float],
    *,
    noise_std: float,
    swap: bool = False,
    chunk: int = 200_000,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Hockey-stick curve of a label mixture of Gaussian-mixture pairs.

    The label ``i`` (drawn with probability ``w_i``) is public, so
    ``delta(eps) = sum_i w_i D_{e^eps}(P_i || Q_i)``.

    Parameters
    ----------
    labels : sequence of (float, MixturePair)
        Label weights (summing to at most 1; missing mass is ignored) and
        pairs.
    epsilons : array_like
        Real epsilons.
    noise_std : float
        Common standard deviation of all components.
    swap : bool, optional
        If true, compute ``D_{e^eps}(Q_i || P_i)`` (the add direction).
    chunk : int, optional
        Maximum number of (label, epsilon) rows handled at once (memory).

    Returns
    -------
    delta, p_mass, q_mass : numpy.ndarray
        The weighted sums of the per-label values of
        :func:`mixture_hockey_stick`.
    p_out : numpy.ndarray
        ``P(not S)`` computed directly (no cancellation in ``1 - p_mass``).
    """
    eps = np.atleast_1d(np.asarray(epsilons, dtype=float))
    w, m, a, b, df = _stack_labels(labels)
    if swap:
        a, b, df = b, a, -df
    nl, ne = w.size, eps.size
    out = np.zeros((4, ne))
    rows_per = max(1, chunk // max(nl, 1))
    for j0 in range(0, ne, rows_per):
        e = eps[j0 : j0 + rows_per]
        ee = np.repeat(e, nl)
        tile = (e.size, 1)
        res = _hockey_rows(
            np.tile(m, tile),
            np.tile(a, tile),
            np.tile(b, tile),
            np.tile(df, tile),
            ee,
            float(noise_std),
        )
        ww = np.tile(w, e.size)
        for r, v in enumerate(res):
            out[r, j0 : j0 + e.size] = np.sum((ww * v).reshape(e.size, nl), axis=1)
    return out[0], out[1], out[2], out[3]


WorstLabels = Sequence[tuple[float, Sequence[MixturePair]]]


def label_sup_delta(
    labels: WorstLabels,
    epsilons: np.ndarray | Sequence[float],
    *,
    noise_std: float,
    swap: bool = False,
    chunk: int = 200_000,
) -> tuple[np.ndarray, np.ndarray]:
    """Label mixture of per-label *worst cases* over several candidate pairs.

    For each public label ``i`` (weight ``w_i``) the curve is the pointwise
    maximum over its candidate pairs ``(P_ij, Q_ij)``:
    ``delta(eps) = sum_i w_i max_j D_{e^eps}(P_ij || Q_ij)``. When the
    candidates of a label are proven to contain the worst configuration for
    every ``eps`` (in either of its regimes), this is the exact supremum
    curve of the label; being a supremum of hockey-stick curves it is convex
    in ``e^eps``, hence the curve of a pair, and connect-the-dots turns it
    into a dominating pair (:func:`pld_bounds_from_curves`).

    Parameters
    ----------
    labels : sequence of (float, sequence of MixturePair)
        Label weights and each label's candidate pairs.
    epsilons : array_like
        Real epsilons.
    noise_std : float
        Common standard deviation of all components.
    swap : bool, optional
        If true, the add direction ``D_{e^eps}(Q_ij || P_ij)``.
    chunk : int, optional
        Maximum number of (label, epsilon) rows handled at once (memory).

    Returns
    -------
    delta : numpy.ndarray
        The mixed supremum curve.
    p_out : numpy.ndarray
        ``sum_i w_i max_j P_ij(L <= eps)``: an upper bound on the mass below
        ``eps`` of every candidate, used to size the loss range.
    """
    delta, p_out, _ = label_candidates_delta(
        labels, epsilons, noise_std=noise_std, swap=swap, chunk=chunk
    )
    return delta, p_out


def label_candidates_delta(
    labels: WorstLabels,
    epsilons: np.ndarray | Sequence[float],
    *,
    noise_std: float,
    swap: bool = False,
    chunk: int = 200_000,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`label_sup_delta` and, from the same evaluations, each candidate's.

    Parameters are those of :func:`label_sup_delta`.

    Returns
    -------
    delta, p_out : numpy.ndarray
        As :func:`label_sup_delta` returns them.
    each : numpy.ndarray
        Shape ``(J, 4, len(epsilons))``: for candidate ``j`` (a label with
        fewer candidates repeats its last), the label mixture of its pairs,
        ``(delta, p_mass, q_mass, p_out)`` as :func:`label_mixture_delta`
        returns them. A lower bracket built on one candidate (a real
        configuration) then costs no evaluation of its own.
    """
    eps = np.atleast_1d(np.asarray(epsilons, dtype=float))
    width = max(len(alts) for _, alts in labels)
    stacks = [
        _stack_labels([(w, alts[min(j, len(alts) - 1)]) for w, alts in labels])
        for j in range(width)
    ]
    nl, ne = len(labels), eps.size
    w = stacks[0][0]
    delta = np.zeros(ne)
    p_out = np.zeros(ne)
    each = np.zeros((width, 4, ne))
    rows_per = max(1, chunk // max(nl, 1))
    for j0 in range(0, ne, rows_per):
        e = eps[j0 : j0 + rows_per]
        ee = np.repeat(e, nl)
        tile = (e.size, 1)
        best_d = np.zeros(e.size * nl)
        best_out = np.zeros(e.size * nl)
        ww = np.tile(w, e.size)
        for j, (_, m, a, b, df) in enumerate(stacks):
            if swap:
                a, b, df = b, a, -df
            res = _hockey_rows(
                np.tile(m, tile),
                np.tile(a, tile),
                np.tile(b, tile),
                np.tile(df, tile),
                ee,
                float(noise_std),
            )
            for r, v in enumerate(res):
                each[j, r, j0 : j0 + e.size] = np.sum(
                    (ww * v).reshape(e.size, nl), axis=1
                )
            best_d = np.maximum(best_d, res[0])
            best_out = np.maximum(best_out, res[3])
        delta[j0 : j0 + e.size] = np.sum((ww * best_d).reshape(e.size, nl), axis=1)
        p_out[j0 : j0 + e.size] = np.sum((ww * best_out).reshape(e.size, nl), axis=1)
    return delta, np.minimum(p_out, 1.0), each


# --------------------------------------------------------------------------
# PLD construction
# --------------------------------------------------------------------------

CurveFn = Callable[[np.ndarray], tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]


def _support_indices(k_lo: int, k_hi: int, relative_spacing: float) -> np.ndarray:
    """Grid indices from ``k_lo`` to ``k_hi``: gap ``max(1, r |k|)``, dense near 0."""
    r = relative_spacing

    def side(limit: int) -> np.ndarray:
        # indices 0 < k <= limit with gaps max(1, floor(r k))
        out = []
        k = 0
        dense_end = min(limit, int(math.ceil(1.0 / r)) if r > 0 else limit)
        out.append(np.arange(1, dense_end + 1))
        k = dense_end
        while k < limit:
            k = min(limit, k + max(1, int(r * k)))
            out.append(np.array([k]))
        return np.concatenate(out) if out else np.empty(0, dtype=int)

    pos = side(max(k_hi, 0)) if k_hi > 0 else np.empty(0, dtype=int)
    neg = -side(-k_lo)[::-1] if k_lo < 0 else np.empty(0, dtype=int)
    idx = np.concatenate([neg, [0], pos]).astype(np.int64)
    idx = idx[(idx >= k_lo) & (idx <= k_hi)]
    return np.unique(np.concatenate([idx, [k_lo, k_hi]]))


def _find_range(curve: CurveFn, tail: float) -> tuple[float, float]:
    """Support ``[eps_lo, eps_hi]`` of a PLD from its curve, within a factor 2^(1/4).

    ``eps_hi >= 0``: the smallest candidate with ``delta(eps_hi) <= tail``.
    ``eps_lo <= 0``: the largest candidate with ``P(L <= eps_lo) <= tail``.
    """
    # 1e-12 .. ~670: tiny sampling rates with large noise have losses of
    # 1e-9 and below (e^eps stays finite up there)
    cand = 1e-12 * 2.0 ** (np.arange(0, 198) / 4.0)
    d_hi = curve(cand)[0]
    ok = np.nonzero(d_hi <= tail)[0]
    if ok.size == 0:
        raise LossTailTooHeavy(
            "privacy loss tail too heavy: delta(eps) > tail_mass up to "
            f"eps = {cand[-1]:.3g}"
        )
    eps_hi = float(cand[ok[0]])
    p_out = curve(-cand)[3]
    ok = np.nonzero(p_out <= tail)[0]
    # P(L <= -c) decreases in c: take the smallest candidate c that passes
    eps_lo = float(-cand[ok[0]]) if ok.size else float(-cand[-1])
    return eps_lo, eps_hi


def _connect_dots_probs(
    h: float, k: np.ndarray, deltas: np.ndarray
) -> tuple[np.ndarray, float]:
    """Pessimistic connect-the-dots masses on support ``k * h`` (any gaps).

    Same formula as ``pld_pmf.create_pmf_pessimistic_connect_dots`` (Doroshenko
    et al. 2022, Alg. 1), vectorised and returning dense arrays.
    """
    deltas = np.minimum.accumulate(np.clip(deltas, 0.0, 1.0))
    gaps = np.diff(k) * h
    dd = np.diff(deltas)
    v1 = np.concatenate([[1.0 - deltas[0]], dd / np.expm1(-gaps)])
    v2 = np.concatenate([dd / np.expm1(gaps), [0.0]])
    return np.maximum(0.0, v1 + v2), float(deltas[-1])


#: How many merged outputs above it a carry of :func:`_garbled_grid_probs`
#: may draw on before it is rounded down instead.
_CARRY_REACH = 16


def _garbled_grid_probs(
    h: float, k: np.ndarray, p_in: np.ndarray, q_in: np.ndarray
) -> np.ndarray:
    """Optimistic masses on the grid from the true pair, every loss moved down.

    ``p_in[j], q_in[j]`` are ``P(L > eps_j)``, ``Q(L > eps_j)`` at the support
    points ``eps_j = k_j h``. Step 1 merges all outputs whose loss lies in
    ``(eps_j, eps_{j+1}]`` (loss ``l_j`` in that interval): a post-processing.
    Step 2 moves every merged loss onto a grid point, from the bottom up: a
    "carry" output (loss below the next grid point ``g``) absorbs the
    fraction of the following merged outputs (losses above ``g``) that makes
    its likelihood ratio exactly ``e^g`` (a randomised post-processing); the
    rest of those outputs carries on. When the next ``16`` outputs cannot
    lift a carry to ``g`` (at small sampling rates, a bulk of mass near loss 0
    outweighs the whole tail), the carry is rounded down to the grid point
    below it instead, so the tail, which decides ``delta``, is never used up
    for the bulk. Mass below ``eps_0`` is dropped.

    Every output ends at a loss at most its own, so ``delta(eps) = sum_l p_l
    (1 - e^{eps - l})_+``, non-decreasing in every loss of every round, is a
    lower bound for one round and for any composition; the error is second
    order in the gaps except for carries rounded down.

    Returns the dense probabilities on indices ``k[0] .. k[-1]``.
    """
    p_in = np.minimum.accumulate(np.clip(p_in, 0.0, 1.0))
    q_in = np.minimum.accumulate(np.clip(q_in, 0.0, 1.0))
    dp_a = np.maximum(-np.diff(p_in), 0.0)
    dq_a = np.maximum(-np.diff(q_in), 0.0)
    # the top output: everything above the last point, loss > eps_last
    dp = np.append(dp_a, p_in[-1]).tolist()
    dq = np.append(dq_a, q_in[-1]).tolist()
    probs = np.zeros(int(k[-1] - k[0]) + 1)
    ex = np.exp(k.astype(float) * h).tolist()
    idx = (k - k[0]).tolist()
    last = k.size - 1
    n = len(dp)
    cp = cq = 0.0  # carry masses
    j = 0  # next merged output to absorb
    t = 1  # index of the grid target (the carry's loss is below grid[t])
    while j < n:
        if cp <= 0.0:
            cp, cq = dp[j], dq[j]
            t = min(j + 1, last)
            j += 1
            continue
        # raise the carry to exactly e^{grid[t]} by absorbing output j
        g = ex[t]
        need = g * cq - cp  # > 0 while the carry's loss is below grid[t]
        if need <= 0.0:
            probs[idx[t]] += cp
            cp = cq = 0.0
            continue
        reach = sum(dp[i] - g * dq[i] for i in range(j, min(n, j + _CARRY_REACH)))
        if reach < need and j + _CARRY_REACH < n:
            # the outputs within reach cannot lift it: round it down
            probs[idx[t - 1]] += cp
            cp = cq = 0.0
            continue
        gain = dp[j] - g * dq[j]  # > 0 when output j's loss exceeds grid[t]
        if gain <= 0.0:
            # output j does not exceed the target: absorb it entirely
            cp += dp[j]
            cq += dq[j]
            j += 1
            continue
        lam = need / gain
        if lam >= 1.0:
            cp += dp[j]
            cq += dq[j]
            j += 1
            continue
        probs[idx[t]] += cp + lam * dp[j]
        cp = (1.0 - lam) * dp[j]
        cq = (1.0 - lam) * dq[j]
        j += 1
        t = min(j, last)
    if cp > 0.0:
        # last carry: loss log(cp / cq) rounded down onto the grid
        if cq > 0:
            loss = math.log(cp / cq)
            grid = k.astype(float) * h
            at = int(np.searchsorted(grid, loss, side="right")) - 1
        else:
            at = last
        probs[idx[max(at, 0)]] += cp
    return probs


def _pmfs_from_curve(
    curve: CurveFn,
    *,
    h: float,
    relative_spacing: float,
    tail: float,
    extra_infinity_mass: float,
    which: tuple[bool, ...] = (True, False),
) -> list[pld_pmf.DensePLDPmf]:
    """Pessimistic and/or optimistic PMFs from one evaluation of the curve."""
    eps_lo, eps_hi = _find_range(curve, tail)
    if (eps_hi - eps_lo) / h > _MAX_POINTS:
        # memory cap: a coarser grid keeps both bounds valid, only looser
        h = (eps_hi - eps_lo) / _MAX_POINTS
    k_lo = int(math.floor(eps_lo / h))
    k_hi = max(int(math.ceil(eps_hi / h)), k_lo + 1)
    k = _support_indices(k_lo, k_hi, relative_spacing)
    deltas, p_in, q_in, _ = curve(k * h)
    out = []
    for pessimistic in which:
        if pessimistic:
            sparse, inf_mass = _connect_dots_probs(h, k, deltas)
            probs = np.zeros(int(k[-1] - k[0]) + 1)
            probs[k - k[0]] = sparse
            inf_mass = min(1.0, inf_mass + extra_infinity_mass)
        else:
            probs = _garbled_grid_probs(h, k, p_in, q_in)
            inf_mass = 0.0
        out.append(pld_pmf.DensePLDPmf(h, int(k[0]), probs, inf_mass, pessimistic))
    return out


def pld_from_label_mixture(
    labels: Labels,
    *,
    noise_std: float,
    value_discretization: float = 1e-5,
    pessimistic: bool = True,
    dropped_label_mass: float = 0.0,
    relative_spacing: float = 0.01,
    tail_mass: float = 1e-18,
) -> PrivacyLossDistribution:
    """PLD (both directions) of a label mixture of Gaussian-mixture pairs.

    Parameters
    ----------
    labels : sequence of (float, MixturePair)
        Public labels: weight ``w_i`` and pair ``(P_i, Q_i)``.
    noise_std : float
        Common standard deviation of all Gaussian components.
    value_discretization : float, optional
        Grid step ``h`` of the privacy loss.
    pessimistic : bool, optional
        True: connect-the-dots upper bound (certified). False: lower bound
        from a garbling (post-processing) of the true pair.
    dropped_label_mass : float, optional
        Weight of labels left out of ``labels``; added to the mass at +infinity
        of the pessimistic PLD (ignored for the optimistic one).
    relative_spacing : float, optional
        Support points are ``h`` apart within ``|eps| <= h / r`` and about
        ``r |eps|`` apart beyond; errors are second order in the gap.
    tail_mass : float, optional
        The loss range is cut where ``delta(eps) <= tail_mass`` (that mass
        goes to +infinity in the pessimistic PLD) and where the P-mass below is
        at most ``tail_mass``.

    Returns
    -------
    dp_accounting.pld.privacy_loss_distribution.PrivacyLossDistribution
        ``pmf_remove`` for ``(P, Q)``, ``pmf_add`` for ``(Q, P)``.

    Raises
    ------
    InvalidParameterError
        For a non-positive ``noise_std`` or ``value_discretization``.

    References
    ----------
    V. Doroshenko, B. Ghazi, P. Kamath, R. Kumar, P. Manurangsi, "Connect the
    Dots: Tighter Discrete Approximations of Privacy Loss Distributions",
    PETS 2022, Algorithm 1.
    """
    sigma = check_positive("noise_std", noise_std)
    h = check_positive("value_discretization", value_discretization)

    upper, lower = pld_bounds_from_label_mixture(
        labels,
        noise_std=sigma,
        value_discretization=h,
        dropped_label_mass=dropped_label_mass,
        relative_spacing=relative_spacing,
        tail_mass=tail_mass,
        which=(pessimistic,),
    )
    return upper if pessimistic else lower


def pld_bounds_from_label_mixture(
    labels: Labels,
    *,
    noise_std: float,
    value_discretization: float = 1e-5,
    dropped_label_mass: float = 0.0,
    relative_spacing: float = 0.01,
    tail_mass: float = 1e-18,
    which: tuple[bool, ...] = (True, False),
) -> tuple[PrivacyLossDistribution, PrivacyLossDistribution]:
    """Upper and lower PLDs of a label mixture from one evaluation of its curves.

    Parameters are those of :func:`pld_from_label_mixture`; ``which`` selects
    the PLDs built (True = pessimistic, False = optimistic); a PLD not built
    is returned as None.

    Returns
    -------
    (PrivacyLossDistribution, PrivacyLossDistribution)
        ``(upper, lower)``.
    """
    sigma = check_positive("noise_std", noise_std)

    def direction(swap: bool) -> CurveFn:
        def curve(e: np.ndarray) -> tuple[np.ndarray, ...]:
            return label_mixture_delta(labels, e, noise_std=sigma, swap=swap)

        return curve  # type: ignore[return-value]

    return pld_bounds_from_curves(
        (direction(False), direction(True)),
        value_discretization=value_discretization,
        dropped_mass=dropped_label_mass,
        relative_spacing=relative_spacing,
        tail_mass=tail_mass,
        which=which,
    )


def pld_bounds_from_curves(
    upper: tuple[CurveFn, CurveFn],
    lower: tuple[CurveFn, CurveFn] | None = None,
    *,
    value_discretization: float,
    dropped_mass: float = 0.0,
    relative_spacing: float = 0.01,
    tail_mass: float = 1e-18,
    which: tuple[bool, ...] = (True, False),
) -> tuple[PrivacyLossDistribution, PrivacyLossDistribution]:
    """Upper and lower PLDs from hockey-stick curves, one pair per direction.

    The upper PLD is connect-the-dots on the ``upper`` curves; it dominates
    any mechanism whose curves lie below them at every real epsilon, provided
    each upper curve is convex in ``e^eps`` (a supremum of hockey-stick
    curves is). The lower PLD is a garbling of the real pairs whose curves
    ``lower`` gives (:func:`_garbled_grid_probs`); those pairs must be
    dominated by the mechanism being bracketed (e.g. one of its
    configurations), so the lower PLD's composition is a lower bound.

    Parameters
    ----------
    upper : (CurveFn, CurveFn)
        Remove and add curves ``eps -> (delta, P(L > eps), Q(L > eps),
        P(L <= eps))``. Only ``delta`` (exact, or an upper bound of a convex
        curve) and ``P(L <= eps)`` (sizes the range; an upper bound will do)
        are read, unless ``lower`` is None.
    lower : (CurveFn, CurveFn) or None, optional
        Remove and add curves of the real pairs garbled for the lower PLD,
        all four outputs exact. None: the ``upper`` curves are those of a real
        pair and one evaluation serves both PLDs.
    value_discretization : float
        Grid step ``h`` of the privacy loss.
    dropped_mass : float, optional
        Probability left out of the curves (e.g. labels below a weight cut);
        added to the mass at +infinity of the upper PLD.
    relative_spacing : float, optional
        Support points are ``h`` apart within ``|eps| <= h / r`` and about
        ``r |eps|`` apart beyond.
    tail_mass : float, optional
        The loss range is cut where ``delta(eps) <= tail_mass`` and where the
        mass below is at most ``tail_mass``.
    which : tuple of bool, optional
        The PLDs built (True = upper, False = lower).

    Returns
    -------
    (PrivacyLossDistribution, PrivacyLossDistribution)
        ``(upper, lower)``; a PLD not built is None.

    Raises
    ------
    InvalidParameterError
        For a non-positive step or spacing, or a negative dropped mass.

    References
    ----------
    Doroshenko et al. 2022 (Connect the Dots), Algorithm 1.
    """
    h = check_positive("value_discretization", value_discretization)
    check_nonnegative("dropped_mass", dropped_mass)
    check_positive("relative_spacing", relative_spacing)
    kw: dict[str, Any] = {
        "h": h,
        "relative_spacing": relative_spacing,
        "tail": tail_mass,
        "extra_infinity_mass": dropped_mass,
    }
    built: dict[bool, list[pld_pmf.DensePLDPmf]] = {pess: [] for pess in which}
    for d in (0, 1):
        if lower is None:
            for pess, pmf in zip(which, _pmfs_from_curve(upper[d], which=which, **kw)):
                built[pess].append(pmf)
            continue
        for pess in which:
            curve = upper[d] if pess else lower[d]
            built[pess].append(_pmfs_from_curve(curve, which=(pess,), **kw)[0])
    result = {pess: PrivacyLossDistribution(*pmfs) for pess, pmfs in built.items()}
    return result.get(True), result.get(False)


def pld_from_delta_curve(
    delta_fn_remove: Callable[[np.ndarray], np.ndarray],
    delta_fn_add: Callable[[np.ndarray], np.ndarray] | None = None,
    *,
    value_discretization: float,
    eps_range: tuple[float, float],
    eps_range_add: tuple[float, float] | None = None,
    relative_spacing: float = 0.01,
) -> PrivacyLossDistribution:
    """Pessimistic (connect-the-dots) PLD from hockey-stick curves.

    Parameters
    ----------
    delta_fn_remove : callable
        Vectorised ``eps -> D_{e^eps}(P || Q)`` (exact values, any real eps).
    delta_fn_add : callable or None, optional
        Same for ``(Q, P)``; None means symmetric.
    value_discretization : float
        Grid step of the privacy loss.
    eps_range : (float, float)
        Support ``[eps_min, eps_max]`` of the remove PLD: mass below
        ``eps_min`` is lumped onto it (pessimistic), ``delta(eps_max)`` goes to
        +infinity.
    eps_range_add : (float, float) or None, optional
        Support of the add PLD (default: ``eps_range``).
    relative_spacing : float, optional
        Support gaps as in :func:`pld_from_label_mixture`.

    Returns
    -------
    dp_accounting.pld.privacy_loss_distribution.PrivacyLossDistribution
        A certified upper bound (dominating pair) in each direction.

    Raises
    ------
    InvalidParameterError
        For a non-positive discretisation or an empty range.

    References
    ----------
    Doroshenko et al. 2022 (Connect the Dots), Algorithm 1.
    """
    h = check_positive("value_discretization", value_discretization)
    check_positive("relative_spacing", relative_spacing)

    def make(fn: Callable[[np.ndarray], np.ndarray], rng: tuple[float, float]) -> Any:
        lo, hi = float(rng[0]), float(rng[1])
        if not hi > lo:
            raise InvalidParameterError(f"eps_range must be increasing; got {rng!r}")
        k_lo = int(math.floor(lo / h))
        k_hi = int(math.ceil(hi / h))
        k = _support_indices(k_lo, k_hi, relative_spacing)
        deltas = np.asarray(fn(k * h), dtype=float)
        sparse, inf_mass = _connect_dots_probs(h, k, deltas)
        probs = np.zeros(int(k[-1] - k[0]) + 1)
        probs[k - k[0]] = sparse
        return pld_pmf.DensePLDPmf(h, int(k[0]), probs, inf_mass, True)

    remove = make(delta_fn_remove, eps_range)
    if delta_fn_add is None:
        return PrivacyLossDistribution(remove)
    return PrivacyLossDistribution(
        remove, make(delta_fn_add, eps_range_add or eps_range)
    )


# --------------------------------------------------------------------------
# Composition and bracketing
# --------------------------------------------------------------------------


#: Largest composed PMF (grid points per direction) built by one FFT. About
#: 32 MiB per array; the FFT, its power and its inverse hold a handful of
#: such arrays at once, so one composition stays near 200 MiB.
MAX_COMPOSED_POINTS = 1 << 22


class _CoarserGridNeeded(Exception):
    """Raised inside :func:`refine_bound`: rebuild one round at ``step``."""

    def __init__(self, step: float) -> None:
        super().__init__(step)
        self.step = step


#: Set by :func:`refine_bound`: a composition over the memory cap asks for a
#: one-round PMF built at the coarser step (second-order error in the step)
#: instead of rebinning the fine one (first-order error, ``count`` times).
_REBUILD_COARSER = contextvars.ContextVar("dpfl_rebuild_coarser", default=False)


def _rebin(pmf: pld_pmf.DensePLDPmf, factor: int) -> pld_pmf.DensePLDPmf:
    """The PMF on a grid ``factor`` times coarser, rounded the sound way.

    A pessimistic PMF moves every loss *up* to the next coarse grid point, an
    optimistic one *down*. ``delta(eps) = inf_mass + sum_l p_l (1 -
    e^{eps - l})_+`` is non-decreasing in every loss ``l``, for one round and
    for the composition (whose losses are sums of per-round losses), so
    rounding up keeps an upper bound an upper bound at any grid and rounding
    down keeps a lower bound a lower bound (the rounding of dp_accounting's
    own pessimistic and optimistic discretisations).
    """
    if factor == 1:
        return pmf
    # pylint: disable=protected-access
    h = pmf._discretization
    probs = np.asarray(pmf._probs, dtype=float)
    idx = pmf._lower_loss + np.arange(probs.size)
    if pmf._pessimistic_estimate:
        new_idx = -((-idx) // factor)  # ceil
    else:
        new_idx = idx // factor  # floor
    lo = int(new_idx[0])
    out = np.bincount(new_idx - lo, weights=probs)
    return pld_pmf.DensePLDPmf(
        h * factor, lo, out, pmf._infinity_mass, pmf._pessimistic_estimate
    )


def _fitted(
    items: Sequence[tuple[Any, int]],
    partners: Sequence[tuple[Any, int]] = (),
    *,
    delta: float | None = None,
    epsilon: float | None = None,
    level: float | None = None,
    floor: float | None = None,
    tail: float = 1e-15,
) -> tuple[list[Any], list[Any], tilted.Plan]:
    """The PMFs ready for :func:`tilted.compose`, coarsened to the memory cap.

    ``items`` (the pessimistic side) choose the tilt and window; ``partners``
    (the optimistic side, may be empty) are composed on the same plan. Each
    item is a PMF or ``("mix", rest, [(weight, PMF, power), ...])`` (a
    :class:`tilted.Mix`), with its count. When
    the FFT would exceed :data:`MAX_COMPOSED_POINTS` points, both sides move
    to a grid a power of two coarser (:func:`_rebin`), or, inside
    :func:`refine_bound`, the one round is rebuilt at that step
    (:class:`_CoarserGridNeeded`).
    """
    factor = 1
    previous = math.inf

    def prepared(spec: Any) -> tilted.Dist | tilted.Mix:
        if isinstance(spec, tuple) and spec[0] == "mix":
            return tilted.Mix(
                [
                    (w, tilted.Dist(_rebin(q.to_dense_pmf(), factor)), k)
                    for w, q, k in spec[2]
                ],
                spec[1],
            )
        return tilted.Dist(_rebin(spec.to_dense_pmf(), factor))

    while True:
        ups = [(prepared(spec), n) for spec, n in items]
        los = [(prepared(spec), n) for spec, n in partners]
        plan = tilted.plan(
            ups,
            delta=delta,
            epsilon=epsilon,
            level=level,
            floor=floor,
            tail=tail,
            partners=los,
        )
        need = tilted.window_length(ups, plan)
        if los:
            need = max(need, tilted.window_length(los, plan))
        if need <= MAX_COMPOSED_POINTS or need >= previous:
            # (a coarser grid that does not shrink the window cannot help)
            return ups, los, plan
        previous = need
        more = 1 << math.ceil(math.log2(need / MAX_COMPOSED_POINTS))
        if _REBUILD_COARSER.get() and factor == 1:
            raise _CoarserGridNeeded(ups[0][0].step * more)
        factor *= more


def self_compose(
    pld: PrivacyLossDistribution,
    count: int,
    *,
    tail_mass_truncation: float = 1e-15,
    delta: float | None = None,
    epsilon: float | None = None,
) -> PrivacyLossDistribution:
    """Compose a PLD with itself ``count`` times (both directions), certified.

    The composition is a :mod:`dpfl.accounting.tilted` FFT whose round-off
    and truncation are bounded a priori: a pessimistic input gives PMFs whose
    ``delta(eps)`` is an upper bound on the true composition's at every
    ``eps``, an optimistic input a lower bound, and either stays a bound when
    composed again.

    Parameters
    ----------
    pld : PrivacyLossDistribution
        One round.
    count : int
        Number of rounds (>= 1).
    tail_mass_truncation : float, optional
        Mass that may be cut from each tail: to +infinity (the top) or onto
        the lowest kept loss (the bottom) for a pessimistic PLD, dropped for
        an optimistic one.
    delta, epsilon : float, optional
        At most one: the query the result will answer. The composition is
        then tilted so that its error is small relative to the tail that
        decides that query, and kept on the window that decides it (other
        queries stay bounds, only looser). Without either, the error is
        uniform, about ``1e-16 log2(N)`` times the count.

    Returns
    -------
    PrivacyLossDistribution
        The composition.

    Raises
    ------
    InvalidParameterError
        If ``count < 1``.
    """
    count = check_count("count", count, minimum=1)
    if count == 1:
        return pld
    check_probability("tail_mass_truncation", tail_mass_truncation)
    out = []
    for pmf in _pmfs_of(pld):
        dists, _, plan = _fitted(
            [(pmf, count)], delta=delta, epsilon=epsilon, tail=tail_mass_truncation
        )
        out.append(tilted.compose(dists, plan))
    return PrivacyLossDistribution(*out)


def _mix_pmfs(parts: Sequence[tuple[float, pld_pmf.PLDPmf]]) -> pld_pmf.DensePLDPmf:
    """Weighted sum of PMFs on one grid; weight left over goes to loss 0."""
    dense = [(w, pmf.to_dense_pmf()) for w, pmf in parts]
    # pylint: disable=protected-access
    h = dense[0][1]._discretization
    pess = dense[0][1]._pessimistic_estimate
    for _, pmf in dense:
        if pmf._discretization != h or pmf._pessimistic_estimate != pess:
            raise InvalidParameterError(
                "public_mixture needs PLDs on one grid of one kind (pessimistic "
                f"or optimistic); got steps {h!r} and {pmf._discretization!r}"
            )
    lo = min(0, *(pmf._lower_loss for _, pmf in dense))
    hi = max(0, *(pmf._lower_loss + pmf._probs.size - 1 for _, pmf in dense))
    probs = np.zeros(hi - lo + 1)
    rest = 1.0 - math.fsum(w for w, _ in dense)
    probs[-lo] += max(rest, 0.0)
    inf_mass = 0.0
    for w, pmf in dense:
        start = pmf._lower_loss - lo
        probs[start : start + pmf._probs.size] += w * np.asarray(pmf._probs)
        inf_mass += w * pmf._infinity_mass
    return pld_pmf.DensePLDPmf(h, lo, probs, min(1.0, inf_mass), pess)


def public_mixture(
    parts: Sequence[tuple[float, PrivacyLossDistribution]],
) -> PrivacyLossDistribution:
    """PLD of a release that draws a *public* label first, then mechanism j.

    With probability ``w_j`` the release is mechanism ``j`` and the label says
    so (e.g. whether a client took part, when the adversary sees who took
    part); with the remaining probability ``1 - sum_j w_j`` it does not depend
    on the data at all. The privacy loss of the labelled output is then the
    loss of the chosen mechanism, so the PLD (each direction) is the weighted
    mixture of the PLDs, and a pessimistic (optimistic) input gives a
    pessimistic (optimistic) output. The label must not depend on the data.

    Parameters
    ----------
    parts : sequence of (float, PrivacyLossDistribution)
        Weights (>= 0, summing to at most 1) and PLDs on one grid.

    Returns
    -------
    PrivacyLossDistribution
        The mixture (both directions).

    Raises
    ------
    InvalidParameterError
        If a weight is out of range, the weights sum to more than 1, or the
        PLDs are on different grids.
    """
    if not parts:
        raise InvalidParameterError("public_mixture needs at least one part; got []")
    for i, (w, _) in enumerate(parts):
        check_probability(f"weight[{i}]", w, allow_zero=True)
    if math.fsum(w for w, _ in parts) > 1.0 + 1e-12:
        raise InvalidParameterError(
            "public_mixture weights must sum to <= 1; got "
            f"{math.fsum(w for w, _ in parts)!r}"
        )
    # pylint: disable=protected-access
    remove = _mix_pmfs([(w, p._pmf_remove) for w, p in parts])
    if all(p._symmetric for _, p in parts):
        return PrivacyLossDistribution(remove)
    return PrivacyLossDistribution(
        remove, _mix_pmfs([(w, p._pmf_add) for w, p in parts])
    )


def compose_bounds(
    pld_upper: PrivacyLossDistribution,
    pld_lower: PrivacyLossDistribution,
    count: int,
) -> tuple[PrivacyLossDistribution, PrivacyLossDistribution]:
    """Compose an upper and a lower PLD ``count`` times each.

    Parameters
    ----------
    pld_upper, pld_lower : PrivacyLossDistribution
        Pessimistic and optimistic PLDs of one round.
    count : int
        Number of rounds.

    Returns
    -------
    (PrivacyLossDistribution, PrivacyLossDistribution)
        The composed upper and lower PLDs (certified envelopes, see
        :func:`self_compose`).
    """
    return self_compose(pld_upper, count), self_compose(pld_lower, count)


def common_step(
    plds: Sequence[PrivacyLossDistribution],
) -> list[PrivacyLossDistribution]:
    """The PLDs on one grid: each moved (soundly) to the coarsest step among them.

    :func:`self_compose` may coarsen a composition to bound its memory, by a
    power of two; before PLDs of different events are composed with each
    other they must share a step. Pessimistic PMFs are rounded up, optimistic
    ones down (:func:`_rebin`).
    """
    # pylint: disable=protected-access
    steps = [pmf._discretization for p in plds for pmf in (p._pmf_remove, p._pmf_add)]
    top = max(steps)
    out = []
    for p in plds:
        pmfs = []
        for pmf in (p._pmf_remove, p._pmf_add):
            dense = pmf.to_dense_pmf()
            factor = int(round(top / dense._discretization))
            if not math.isclose(factor * dense._discretization, top, rel_tol=1e-9):
                raise InvalidParameterError(
                    "PLD grid steps must be power-of-two multiples of one "
                    f"another; got {dense._discretization!r} and {top!r}"
                )
            pmfs.append(_rebin(dense, factor))
        out.append(
            PrivacyLossDistribution(pmfs[0])
            if p._symmetric
            else PrivacyLossDistribution(pmfs[0], pmfs[1])
        )
    return out


def _tail_sums(
    pmf: pld_pmf.PLDPmf,
) -> tuple[float, float, np.ndarray, np.ndarray, np.ndarray]:
    """``(h, inf, losses, G, C)`` of the PMF's losses from about 0 up.

    ``C_i = sum_{j >= i} p_j e^{-(l_j - l_i)}`` and ``G_i = sum_{j > i} p_j
    (1 - e^{-(l_j - l_i)})`` (so ``delta(l_i) = inf + G_i``), by the
    recurrences ``C_{i-1} = p_{i-1} + e^{-h} C_i`` and ``G_{i-1} = G_i +
    (1 - e^{-h}) C_i``: sums of non-negative terms only, so the relative
    rounding error stays below :func:`tilted.summation_margin`.
    """
    from scipy import signal  # pylint: disable=import-outside-toplevel

    # pylint: disable=protected-access
    dense = pmf.to_dense_pmf()
    inf_mass = float(dense._infinity_mass)
    h = float(dense._discretization)
    lower = int(dense._lower_loss)
    start = max(0, -lower)  # only losses from about 0 matter for eps >= 0
    probs = np.maximum(np.asarray(dense._probs[start:], dtype=float), 0.0)
    losses = (lower + start + np.arange(probs.size)) * h
    c_suf = signal.lfilter([1.0], [1.0, -math.exp(-h)], probs[::-1])[::-1]
    g = np.zeros(probs.size)
    if probs.size > 1:
        g[:-1] = -math.expm1(-h) * np.cumsum(c_suf[:0:-1])[::-1]
    return h, inf_mass, losses, g, c_suf


def pmf_epsilon_for_delta(pmf: pld_pmf.PLDPmf, delta: float) -> float:
    """Smallest ``eps >= 0`` with ``delta(eps) <= delta`` for one PMF, vectorised.

    The same quantity as dp_accounting's ``get_epsilon_for_delta`` (a Python
    loop over every grid point, seconds on a 4e6-point PMF). On
    ``(l_{i-1}, l_i]``, ``delta(eps) = inf + G_i + C_i (1 - e^{eps - l_i})``
    with the non-negative tail sums of :func:`_tail_sums` (no cancellation at
    any loss or step). Negative probabilities count as zero.
    """
    h, inf_mass, losses, g, c_suf = _tail_sums(pmf)
    if inf_mass > delta:
        return math.inf
    if losses.size == 0:
        return 0.0
    rest = delta - inf_mass
    ok = np.nonzero(g <= rest)[0]
    if ok.size == 0:
        return math.inf
    i = int(ok[0])
    lo_edge = float(losses[i - 1]) if i > 0 else -math.inf
    if c_suf[i] <= 0.0:
        return max(0.0, lo_edge if i > 0 else float(losses[i]))
    r = (rest - g[i]) / c_suf[i]  # = 1 - e^{eps - l_i}, in [0, 1)
    if r >= 1.0:
        return max(0.0, lo_edge if i > 0 else 0.0)
    eps = float(losses[i]) + math.log1p(-r)
    return max(0.0, min(max(eps, lo_edge), float(losses[i])))


def pmf_delta_for_epsilon(pmf: pld_pmf.PLDPmf, epsilon: float) -> float:
    """``delta(eps) = inf + sum_{l > eps} p_l (1 - e^{eps - l})`` for one PMF.

    A sum of non-negative terms (negative probabilities count as zero).
    """
    # pylint: disable=protected-access
    dense = pmf.to_dense_pmf()
    h = float(dense._discretization)
    lower = int(dense._lower_loss)
    probs = np.asarray(dense._probs, dtype=float)
    first = max(0, int(math.floor(epsilon / h)) - lower)
    losses = (lower + first + np.arange(probs.size - first)) * h
    p = np.maximum(probs[first:], 0.0)
    terms = np.where(losses > epsilon, p * -np.expm1(epsilon - losses), 0.0)
    return float(dense._infinity_mass) + float(np.sum(terms))


def _pmfs_of(p: PrivacyLossDistribution) -> list[pld_pmf.PLDPmf]:
    # pylint: disable=protected-access
    return [p._pmf_remove] if p._symmetric else [p._pmf_remove, p._pmf_add]


def _certified_epsilon(pmf: pld_pmf.PLDPmf, delta: float, *, upper: bool) -> float:
    """epsilon(delta) of a certified composition or an exact PMF, on the safe side.

    A :class:`tilted.CertifiedPmf` is read with its own error bound; any
    other PMF is taken as exact, with the reading's rounding
    (:func:`tilted.summation_margin`) on the safe side.
    """
    if isinstance(pmf, tilted.CertifiedPmf):
        return pmf.epsilon_upper(delta) if upper else pmf.epsilon_lower(delta)
    margin = tilted.summation_margin(pmf.size)
    if upper:
        eps = pmf_epsilon_for_delta(pmf, delta / (1.0 + margin))
        return eps * (1 + 8 * tilted.UNIT_ROUNDOFF) if math.isfinite(eps) else eps
    eps = pmf_epsilon_for_delta(pmf, min(delta * (1.0 + margin), 1.0))
    return max(0.0, eps * (1 - 8 * tilted.UNIT_ROUNDOFF))


def _certified_delta(pmf: pld_pmf.PLDPmf, epsilon: float, *, upper: bool) -> float:
    """delta(epsilon) of a certified composition or an exact PMF, on the safe side."""
    if isinstance(pmf, tilted.CertifiedPmf):
        return pmf.delta_upper(epsilon) if upper else pmf.delta_lower(epsilon)
    margin = tilted.summation_margin(pmf.size)
    d = pmf_delta_for_epsilon(pmf, epsilon)
    return min(1.0, d * (1.0 + margin)) if upper else max(0.0, d / (1.0 + margin))


def epsilon_bound(
    upper: PrivacyLossDistribution, lower: PrivacyLossDistribution, delta: float
) -> Bound:
    """Bracket epsilon(delta) between an upper and a lower PLD.

    The PLDs must be exact or certified envelopes (:func:`self_compose`,
    :func:`compose_bounds`, :func:`refine_bound`): the upper value is the
    pessimistic PLD's ``epsilon`` read at ``delta / (1 + s)`` and the lower
    the optimistic PLD's read at ``delta (1 + s)``, ``s`` the relative
    rounding bound of the reading (:func:`tilted.summation_margin`). A lower
    value above the upper one (which certified inputs cannot give) is never
    clipped into a point: the bracket is then the hull of the two.

    Parameters
    ----------
    upper, lower : PrivacyLossDistribution
        Pessimistic and optimistic PLDs of the same mechanism.
    delta : float
        Target delta in (0, 1).

    Returns
    -------
    Bound
        ``lower <= true epsilon <= upper``; the estimate is the midpoint.
    """
    delta = check_delta("delta", delta)
    eu = max(_certified_epsilon(p, delta, upper=True) for p in _pmfs_of(upper))
    el = max(_certified_epsilon(p, delta, upper=False) for p in _pmfs_of(lower))
    lo, hi = min(el, eu), max(el, eu)
    return Bound(lo, 0.5 * (lo + hi) if math.isfinite(hi) else hi, hi)


def delta_bound(
    upper: PrivacyLossDistribution, lower: PrivacyLossDistribution, epsilon: float
) -> Bound:
    """Bracket delta(epsilon) between an upper and a lower PLD.

    As :func:`epsilon_bound`: exact or certified PLDs, the reading's rounding
    bound added to the upper value and taken from the lower one.

    Parameters
    ----------
    upper, lower : PrivacyLossDistribution
        Pessimistic and optimistic PLDs of the same mechanism.
    epsilon : float
        Target epsilon (>= 0).

    Returns
    -------
    Bound
        ``lower <= true delta <= upper``.
    """
    epsilon = check_nonnegative("epsilon", epsilon)
    du = max(_certified_delta(p, epsilon, upper=True) for p in _pmfs_of(upper))
    dl = max(_certified_delta(p, epsilon, upper=False) for p in _pmfs_of(lower))
    lo, hi = min(dl, du), max(dl, du)
    return Bound(lo, 0.5 * (lo + hi), hi)


@dataclasses.dataclass(frozen=True)
class BracketResult:
    """Outcome of :func:`refine_bound`.

    Attributes
    ----------
    bound : Bound
        The bracket reached.
    value_discretization : float
        The finest grid step used.
    gap : float
        Achieved relative gap ``(upper - lower) / upper``.
    converged : bool
        Whether ``gap <= tolerance``.
    coarse : bool
        Whether a composition was moved to a coarser grid than asked for to
        stay within the memory cap (:data:`MAX_COMPOSED_POINTS`); the bracket
        is then wider, never unsound.
    """

    bound: Bound
    value_discretization: float
    gap: float
    converged: bool
    coarse: bool = False


@dataclasses.dataclass(frozen=True)
class MixturePart:
    """Rounds that draw a public label, then release a composition or nothing.

    With probability ``weights[j]`` a round releases the ``powers[j]``-fold
    composition of the mechanism whose one-step PLDs are ``uppers[j]``
    (pessimistic) and ``lowers[j]`` (optimistic), and the adversary sees
    which; otherwise it releases nothing. A check-in round of ``K`` local
    steps is one such term. :func:`bracket_parts` composes it by evaluating
    the round's transform ``rest + sum_j w_j X_j^k_j`` directly
    (:class:`tilted.Mix`), so no inner composition is formed.

    Attributes
    ----------
    weights : tuple of float
        The labels' probabilities (summing to at most 1).
    uppers, lowers : tuple of PrivacyLossDistribution
        Each label's one-step PLDs, all on one grid.
    powers : tuple of int
        How many steps each label composes.
    count : int
        Number of rounds.
    """

    weights: tuple[float, ...]
    uppers: tuple[PrivacyLossDistribution, ...]
    lowers: tuple[PrivacyLossDistribution, ...]
    powers: tuple[int, ...]
    count: int


#: One distinct event of a composition: its (upper, lower) one-round PLDs on
#: one grid and how often it is composed, or a :class:`MixturePart`.
Part = tuple[PrivacyLossDistribution, PrivacyLossDistribution, int] | MixturePart


def _part_plds(part: Part) -> list[PrivacyLossDistribution]:
    """Every PLD a part holds (upper ones first)."""
    if isinstance(part, MixturePart):
        return [*part.uppers, *part.lowers]
    return [part[0], part[1]]


def _part_uppers(part: Part) -> list[PrivacyLossDistribution]:
    if isinstance(part, MixturePart):
        return list(part.uppers)
    return [part[0]]


def _part_count(part: Part) -> int:
    return part.count if isinstance(part, MixturePart) else part[2]


def _side(part: Part, add: bool, pessimistic: bool) -> Any:
    """One side and direction of a part, for :func:`_fitted`."""
    if isinstance(part, MixturePart):
        plds = part.uppers if pessimistic else part.lowers
        rest = max(0.0, 1.0 - math.fsum(part.weights))
        return (
            "mix",
            rest,
            [
                (w, _direction(q, add), k)
                for w, q, k in zip(part.weights, plds, part.powers, strict=True)
            ],
        )
    return _direction(part[0] if pessimistic else part[1], add)


def _direction(p: PrivacyLossDistribution, add: bool) -> pld_pmf.PLDPmf:
    # pylint: disable=protected-access
    return p._pmf_add if add and not p._symmetric else p._pmf_remove


def bracket_parts(
    parts: Sequence[Part],
    *,
    delta: float | None = None,
    epsilon: float | None = None,
    hint: Sequence[float] | None = None,
) -> tuple[Bound, float, tuple[float, ...]]:
    """Bracket ``epsilon(delta)`` or ``delta(epsilon)`` of a composition.

    Every part is composed by one certified, tilted FFT per direction and
    side (:mod:`dpfl.accounting.tilted`), tilted for the query, so the
    bracket holds at every ``delta`` the grid resolves, down to the smallest.

    Parameters
    ----------
    parts : sequence of (PrivacyLossDistribution, PrivacyLossDistribution, int) \
or MixturePart
        For each distinct event: its pessimistic and optimistic one-round
        PLDs (all on one grid) and its count, or a :class:`MixturePart`.
    delta, epsilon : float, optional
        Exactly one: the query.
    hint : sequence of float, optional
        For ``epsilon(delta)``: known lower values of each direction's answer
        (remove, then add; the third value returned by an earlier call). The
        tilt is then chosen for that loss (the Chernoff estimate of the
        answer, used otherwise, can be far above it when the tail is a rare
        event), and a composition whose error bound is not small at its
        answer is redone with the tilt for its lower value.

    Returns
    -------
    (Bound, float, tuple of float)
        The bracket, the grid step of the compositions (coarser than the
        parts' when the memory cap moved them) and each direction's lower
        value.
    """
    if (delta is None) == (epsilon is None):
        raise InvalidParameterError("give exactly one of delta and epsilon")
    used = [part for part in parts if _part_count(part) > 0]
    symmetric = all(
        q._symmetric  # pylint: disable=protected-access
        for part in used
        for q in _part_plds(part)
    )
    upper = lower = 0.0
    step = 0.0
    lowers = []
    for add in (False,) if symmetric else (False, True):
        items_up = [(_side(part, add, True), _part_count(part)) for part in used]
        items_lo = [(_side(part, add, False), _part_count(part)) for part in used]
        floor: float | None = None
        known = hint[int(add)] if hint is not None and len(hint) > int(add) else 0.0
        level = known if delta is not None and known > 0 else None
        extended: bool | None = None  # decided by the composition
        tries = 0
        while True:
            tries += 1
            du, dl, plan = _fitted(
                items_up,
                items_lo,
                delta=delta,
                epsilon=epsilon,
                level=level,
                floor=floor,
            )
            cu = tilted.compose(du, plan, extended=extended)
            cl = tilted.compose(dl, plan, extended=extended)
            step = max(step, du[0][0].step)
            if delta is None:
                eps = float(epsilon)  # type: ignore[arg-type]
                hi, lo = cu.delta_upper(eps), cl.delta_lower(eps)
                if tries < 2 and tilted._EXTENDED and cu.noise(eps) > 1e-3 * hi:
                    extended = True  # the error bound matters: redo it finer
                    continue
                break
            hi = cu.epsilon_upper(delta)
            lo = cl.epsilon_lower(delta)
            if tries >= 4:
                break
            # pylint: disable=protected-access
            bottom = cu._lower_loss * cu._discretization
            if floor is None and bottom > 0 and min(lo, hi) <= bottom + step:
                # the answer sits at the window's foot: widen it to 0
                floor = 0.0
                continue
            noisy = math.isfinite(hi) and cu.noise(hi) > 1e-3 * delta
            if noisy and level is None:
                # the tilt (from the Chernoff estimate) did not fit the answer:
                # redo it for the loss of the lower value
                level = max(lo, 0.0)
                continue
            if noisy and not extended and tilted._EXTENDED:
                extended = True  # the error bound matters: redo it finer
                continue
            break
        upper, lower = max(upper, hi), max(lower, lo)
        lowers.append(lo)
    lo_v, hi_v = min(lower, upper), max(lower, upper)
    mid = 0.5 * (lo_v + hi_v) if math.isfinite(hi_v) else hi_v
    return Bound(lo_v, mid, hi_v), step, tuple(lowers)


def start_discretization(tolerance: float) -> float:
    """A first grid step whose bracket is about ``tolerance`` wide.

    One-round PLDs built by connect-the-dots and garbling are second-order
    accurate in the step ``h``: for Poisson-subsampled Gaussians the
    bracket's relative width is about ``2000 h^2`` whatever the number of
    rounds (1e2 to 1e5 measured), so :func:`refine_bound` starts there and
    halves the step until the bracket is within the tolerance.
    """
    return float(min(1e-2, max(1e-6, 0.8 * math.sqrt(tolerance / 2000.0))))


def refine_bound(
    build: Callable[[float], tuple[PrivacyLossDistribution, PrivacyLossDistribution]],
    *,
    count: int,
    delta: float | None = None,
    epsilon: float | None = None,
    tolerance: float = 0.02,
    initial_discretization: float = 1e-4,
    max_grid_points: int = 8_000_000,
    resolution: float = 0.0,
) -> BracketResult:
    """Halve the grid step until the composed bracket is within ``tolerance``.

    Parameters
    ----------
    build : callable
        ``h -> (pld_upper, pld_lower)`` for one round at grid step ``h``.
    count : int
        Number of rounds.
    delta, epsilon : float, optional
        Exactly one: bracket epsilon(delta) or delta(epsilon).
    tolerance : float, optional
        Target relative gap ``(upper - lower) / upper``.
    initial_discretization : float, optional
        First grid step.
    max_grid_points : int, optional
        Stop refining once a one-round PMF would exceed this many points
        (memory cap); the achieved gap is reported.
    resolution : float, optional
        With ``delta``: an epsilon bracket at most this wide (absolute) is
        converged whatever its relative width. A calibration asks only
        whether epsilon is below its target, so it sets this to a small
        fraction of the target; otherwise a tiny epsilon (e.g. 3e-6 for a
        round of random participation at p = 1e-4) drives the grid to steps of
        epsilon times the tolerance, a minute a query (measured: 73 s), and
        to no purpose.

    Returns
    -------
    BracketResult
        The bracket, the grid step, the gap, and whether it converged.

    Raises
    ------
    InvalidParameterError
        If neither or both of ``delta`` and ``epsilon`` are given.
    """
    count = check_count("count", count, minimum=1)
    return refine_parts(
        lambda h: [(*build(h), count)],
        delta=delta,
        epsilon=epsilon,
        tolerance=tolerance,
        initial_discretization=initial_discretization,
        max_grid_points=max_grid_points,
        resolution=resolution,
    )


def refine_parts(
    build: Callable[[float], Sequence[Part]],
    *,
    delta: float | None = None,
    epsilon: float | None = None,
    tolerance: float = 0.02,
    initial_discretization: float = 1e-4,
    max_grid_points: int = 8_000_000,
    resolution: float = 0.0,
) -> BracketResult:
    """:func:`refine_bound` for a composition of several distinct events.

    Parameters
    ----------
    build : callable
        ``h -> [(pld_upper, pld_lower, count), ...]``: each distinct event's
        one-round PLDs at grid step ``h`` and its count.
    delta, epsilon, tolerance, initial_discretization, max_grid_points, \
resolution
        As in :func:`refine_bound`.

    Returns
    -------
    BracketResult
        The bracket, the grid step, the gap, and whether it converged.
    """
    if (delta is None) == (epsilon is None):
        raise InvalidParameterError("give exactly one of delta and epsilon")
    check_probability("tolerance", tolerance)
    check_nonnegative("resolution", resolution)
    h = check_positive("initial_discretization", initial_discretization)
    lo_v, hi_v = -math.inf, math.inf
    rebuilt = False
    scaled = 0
    stalls = 0
    prev_gap = math.inf
    known: tuple[float, ...] | None = None
    while True:
        # Over the memory cap, the one round is rebuilt at the coarser step
        # (once; a second overflow is rebinned, see _fitted).
        token = _REBUILD_COARSER.set(not rebuilt)
        try:
            parts = build(h)
            scale = min(
                _scale(p)
                for part in parts
                for u in _part_uppers(part)
                for p in _pmfs_of(u)
            )
            b, step, lowers = bracket_parts(
                parts, delta=delta, epsilon=epsilon, hint=known
            )
        except _CoarserGridNeeded as need:
            h, rebuilt = need.step, True
            continue
        finally:
            _REBUILD_COARSER.reset(token)
        if delta is not None:
            known = lowers if known is None else tuple(map(max, known, lowers))
        own_gap = b.gap if b.upper > 0 else 0.0
        # Every bracket holds the truth, so their intersection does too; an
        # empty intersection (impossible for certified brackets) keeps the hull.
        # The bracket of a grid about to be replaced by the losses' own scale
        # counts too: the finer grid can come out looser (measured: random
        # participation at p q = 1.6e-6, 1024 rounds, delta 3.4e-15: [0.072,
        # 0.0959] at 1e-5, [0.0073, 0.0967] at the own scale, capped in memory).
        new_lo, new_hi = max(lo_v, b.lower), min(hi_v, b.upper)
        if new_lo > new_hi:
            new_lo, new_hi = min(lo_v, b.lower), max(hi_v, b.upper)
        lo_v, hi_v = new_lo, new_hi
        resolved = _resolved(lo_v, hi_v, delta, resolution)
        if 0 < scale < h / 2 and scaled < 4 and not rebuilt and not resolved:
            # the grid is coarse against one round's losses (tiny sampling
            # rates: losses of the order of the rate): rebuild on their
            # scale, unless the answer is already resolved
            h, scaled = scale, scaled + 1
            continue
        mid = 0.5 * (lo_v + hi_v) if math.isfinite(hi_v) else hi_v
        b = Bound(lo_v, mid, hi_v)
        gap = b.gap if b.upper > 0 else 0.0
        # pylint: disable=protected-access
        own = max(
            p._discretization
            for part in parts
            for q in _part_plds(part)
            for p in _pmfs_of(q)
        )
        coarse = rebuilt or step > h * (1 + 1e-9) or own > h * (1 + 1e-9)
        converged = gap <= tolerance or _resolved(lo_v, hi_v, delta, resolution)
        best = BracketResult(b, max(step, own), gap, converged, coarse)
        size = max(
            p.size for part in parts for u in _part_uppers(part) for p in _pmfs_of(u)
        )
        # A finer step cannot help once compositions are coarsened to fit the
        # memory cap, and the next step doubles the grid (the time model).
        # Two finer grids in a row that did not narrow their own bracket while
        # its lower value was informative (the error bound, not the grid,
        # limits it): a third will not either.
        stalled = b.lower > 0 and own_gap > 0.95 * prev_gap
        stalls = stalls + 1 if stalled else 0
        prev_gap = own_gap
        if best.converged or coarse or stalls >= 2 or 2 * size > max_grid_points:
            return best
        h /= 2.0


#: A delta bracket whose upper end is below this is resolved: the smallest
#: delta dpfl accepts is 1e-15, and refining a delta of 1e-26 towards a 2%
#: relative gap took 13 finer grids (34 s) for nothing anyone reads.
DELTA_FLOOR = 1e-18


def _resolved(
    lower: float, upper: float, delta: float | None, resolution: float
) -> bool:
    """Whether a bracket is accurate enough whatever its relative width."""
    if delta is not None:  # an epsilon bracket
        return upper - lower <= resolution
    return upper <= DELTA_FLOOR


#: A grid step should resolve one round's losses: at most their standard
#: deviation over this, and their span over 4 times this.
_STEPS_PER_SCALE = 8


def _scale(pmf: pld_pmf.PLDPmf) -> float:
    """The largest grid step that resolves one PMF's losses (0 if a point)."""
    # pylint: disable=protected-access
    dense = pmf.to_dense_pmf()
    probs = np.maximum(np.asarray(dense._probs, dtype=float), 0.0)
    nz = np.flatnonzero(probs)
    if nz.size < 2:
        return 0.0
    h = dense._discretization
    w = probs[nz] / np.sum(probs[nz])
    loss = (nz - nz[0]) * h
    mean = float(np.sum(w * loss))
    std = math.sqrt(float(np.sum(w * (loss - mean) ** 2)))
    span = float(loss[-1])
    return min(std, span / 4.0) / _STEPS_PER_SCALE
