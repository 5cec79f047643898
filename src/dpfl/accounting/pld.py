"""Certified composition of privacy-loss distributions, and its bracketing.

dp_accounting is the engine (its :class:`PrivacyLossDistribution` and PMFs);
the accounting builds one round's PLDs elsewhere
(:mod:`dpfl.accounting.hockey`: exact hockey-stick curves of Gaussian-mixture
pairs; :mod:`dpfl.accounting.discretise`: upper and lower PLDs from such
curves) and composes them here: :func:`self_compose` and
:func:`bracket_parts` run an exponentially tilted FFT whose round-off and
truncation are bounded a priori (:mod:`dpfl.accounting.tilted`), tilted for
the query so that the bounds hold at every delta down to the smallest, with
a memory cap (:data:`MAX_COMPOSED_POINTS`: past it, the one round is
rebuilt, or rebinned, on a coarser grid with sound rounding). The
bracketing helpers are :func:`compose_bounds`, :func:`epsilon_bound` and
:func:`delta_bound`; :mod:`dpfl.accounting.refine` refines the grid until a
bracket is tight.

Conventions (dp_accounting's): ``pmf_remove`` is the PLD of
``(P, Q) = (M(D), M(D'))`` where ``D'`` has one record less, i.e. P is the
output distribution *with* the record; ``pmf_add`` is the PLD of ``(Q, P)``.
``delta(epsilon)`` of a PLD is the maximum over the two directions.
"""

from __future__ import annotations

import contextvars
import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from dp_accounting.pld import pld_pmf
from dp_accounting.pld.privacy_loss_distribution import PrivacyLossDistribution

from dpfl._validate import (
    check_count,
    check_delta,
    check_nonnegative,
    check_probability,
)
from dpfl.accounting import envelope, lossdists, tilted
from dpfl.accounting.bounds import Bound
from dpfl.errors import InvalidParameterError

__all__ = [
    "MAX_COMPOSED_POINTS",
    "MixturePart",
    "bracket_parts",
    "common_step",
    "compose_bounds",
    "delta_bound",
    "epsilon_bound",
    "pmf_delta_for_epsilon",
    "pmf_epsilon_for_delta",
    "public_mixture",
    "self_compose",
]


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
    error_share: float | None = None,
) -> tuple[list[Any], list[Any], tilted.Plan]:
    """The PMFs ready for :func:`tilted.compose`, coarsened to the memory cap.

    ``items`` (the pessimistic side) choose the tilt and window; ``partners``
    (the optimistic side, may be empty) are composed on the same plan. Each
    item is a PMF or ``("mix", rest, [(weight, PMF, power), ...])`` (a
    :class:`lossdists.Mix`), with its count. When
    the FFT would exceed :data:`MAX_COMPOSED_POINTS` points, both sides move
    to a grid a power of two coarser (:func:`_rebin`), or, inside
    :func:`refine_bound`, the one round is rebuilt at that step
    (:class:`_CoarserGridNeeded`).
    """
    factor = 1
    previous = math.inf

    def prepared(spec: Any) -> lossdists.Dist | lossdists.Mix:
        if isinstance(spec, tuple) and spec[0] == "mix":
            return lossdists.Mix(
                [
                    (w, lossdists.dist_of(_rebin(q.to_dense_pmf(), factor)), k)
                    for w, q, k in spec[2]
                ],
                spec[1],
            )
        return lossdists.dist_of(_rebin(spec.to_dense_pmf(), factor))

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
            error_share=error_share,
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
    rounding error stays below :func:`envelope.summation_margin`.
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

    A :class:`envelope.CertifiedPmf` is read with its own error bound; any
    other PMF is taken as exact, with the reading's rounding
    (:func:`envelope.summation_margin`) on the safe side.
    """
    if isinstance(pmf, envelope.CertifiedPmf):
        return pmf.epsilon_upper(delta) if upper else pmf.epsilon_lower(delta)
    margin = envelope.summation_margin(pmf.size)
    if upper:
        eps = pmf_epsilon_for_delta(pmf, delta / (1.0 + margin))
        return eps * (1 + 8 * envelope.UNIT_ROUNDOFF) if math.isfinite(eps) else eps
    eps = pmf_epsilon_for_delta(pmf, min(delta * (1.0 + margin), 1.0))
    return max(0.0, eps * (1 - 8 * envelope.UNIT_ROUNDOFF))


def _certified_delta(pmf: pld_pmf.PLDPmf, epsilon: float, *, upper: bool) -> float:
    """delta(epsilon) of a certified composition or an exact PMF, on the safe side."""
    if isinstance(pmf, envelope.CertifiedPmf):
        return pmf.delta_upper(epsilon) if upper else pmf.delta_lower(epsilon)
    margin = envelope.summation_margin(pmf.size)
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
    rounding bound of the reading (:func:`envelope.summation_margin`). A lower
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
class MixturePart:
    """Rounds that draw a public label, then release a composition or nothing.

    With probability ``weights[j]`` a round releases the ``powers[j]``-fold
    composition of the mechanism whose one-step PLDs are ``uppers[j]``
    (pessimistic) and ``lowers[j]`` (optimistic), and the adversary sees
    which; otherwise it releases nothing. A check-in round of ``K`` local
    steps is one such term. :func:`bracket_parts` composes it by evaluating
    the round's transform ``rest + sum_j w_j X_j^k_j`` directly
    (:class:`lossdists.Mix`), so no inner composition is formed.

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
    error_share: float | None = None,
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
    error_share : float, optional
        The share of the query's delta the FFT error may take where a
        smaller tilt shortens the transform (:func:`tilted.plan`); None: the
        Chernoff tilt.

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
                error_share=error_share,
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
