"""Exact hockey-stick divergences of label mixtures of Gaussian-mixture pairs.

A :class:`MixturePair` is a pair of finite Gaussian mixtures with a common
standard deviation; :func:`mixture_hockey_stick` integrates the positive part
of ``P - e^eps Q`` over every interval between its roots, and
:func:`label_mixture_delta`, :func:`label_sup_delta` and
:func:`label_candidates_delta` mix such curves over public labels (the curves
that :mod:`dpfl.accounting.discretise` turns into PLDs).

Roots. The integrand ``sum_k c_k phi_sigma(z - m_k)`` has at most as many
real roots as its coefficient sequence (ordered by mean) has sign changes,
because ``exp(m z / sigma^2)`` is a totally positive kernel (Descartes' rule
for exponential sums). :func:`_roots` finds all of them by a recursion of that
depth: for S sign changes, multiplying by ``exp(-mu z / sigma^2)`` with ``mu``
between the first two sign blocks and differentiating leaves exactly S - 1
sign changes, whose roots separate the roots of the original function.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np
from scipy import special

from dpfl.errors import InvalidParameterError

__all__ = [
    "MixturePair",
    "label_candidates_delta",
    "label_mixture_delta",
    "label_sup_delta",
    "mixture_hockey_stick",
]


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

    Also returns the derivatives of both logs with respect to z. Both parts
    are scaled by the row's largest term (one exponential per term, the hot
    loop of every root search): a part below the other by more than the
    float range comes out as log 0 = -inf, which still has the right sign,
    and near a root, where the two parts are comparable, nothing is lost.
    """
    expo = logc + (m * s) * z[:, None] - (0.5 * s) * (m * m)
    top = np.max(expo, axis=1)
    top = np.where(np.isfinite(top), top, 0.0)
    e = np.exp(expo - top[:, None])  # 0 where c_k = 0 (logc = -inf)
    ep = np.where(sgn > 0, e, 0.0)
    en = e - ep
    part_p = ep.sum(axis=1)
    part_n = en.sum(axis=1)
    ms = np.broadcast_to(m * s, e.shape)
    with np.errstate(divide="ignore", invalid="ignore"):
        lp = np.log(part_p) + top
        ln = np.log(part_n) + top
        dp = np.where(part_p > 0, (ep * ms).sum(axis=1) / part_p, 0.0)
        dn = np.where(part_n > 0, (en * ms).sum(axis=1) / part_n, 0.0)
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
