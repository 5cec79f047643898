"""One round's privacy-loss distributions from hockey-stick curves, upper and lower.

PLDs built from curves in both directions, pessimistic (connect-the-dots on
a non-uniform set of grid points, Doroshenko et al. 2022, Alg. 1) and
optimistic (a garbling of the true pair with losses on the grid):
:func:`pld_bounds_from_curves` for any curves, :func:`pld_from_label_mixture`
and :func:`pld_bounds_from_label_mixture` for label mixtures of
Gaussian-mixture pairs (:mod:`dpfl.accounting.hockey`), and
:func:`pld_from_delta_curve` for any scheme whose hockey-stick curves are
known. :mod:`dpfl.accounting.pld` composes them.

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

import math
from collections.abc import Callable
from typing import Any

import numpy as np
from dp_accounting.pld import pld_pmf
from dp_accounting.pld.privacy_loss_distribution import PrivacyLossDistribution

from dpfl._validate import (
    check_nonnegative,
    check_positive,
)
from dpfl.accounting.hockey import Labels, label_mixture_delta
from dpfl.errors import InvalidParameterError

__all__ = [
    "LossTailTooHeavy",
    "pld_bounds_from_curves",
    "pld_bounds_from_label_mixture",
    "pld_from_delta_curve",
    "pld_from_label_mixture",
]


_MAX_POINTS = 4_000_000  # one-round PMF size cap per direction


class LossTailTooHeavy(InvalidParameterError):
    """One round's privacy loss keeps more than the tail mass beyond e^670.

    Too little noise for the sampling: no discretised PLD can hold the loss,
    and the certified answer is the trivial one (ε = ∞, δ = 1).
    """


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
