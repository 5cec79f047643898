"""Refining the grid of a composition until its bracket is tight enough.

:func:`refine_bound` (one event composed ``count`` times) and
:func:`refine_parts` (several distinct events) build one round's PLDs at a
grid step, bracket the composition (:func:`dpfl.accounting.pld.bracket_parts`)
and halve the step until the bracket's relative width is within the
tolerance, rebuilding on the losses' own scale when the grid is coarse
against them and on a coarser grid past the memory cap.
"""

from __future__ import annotations

import dataclasses
import math
import weakref
from collections.abc import Callable, Sequence

import numpy as np
from dp_accounting.pld import pld_pmf
from dp_accounting.pld.privacy_loss_distribution import PrivacyLossDistribution

from dpfl._validate import (
    check_count,
    check_nonnegative,
    check_positive,
    check_probability,
)
from dpfl.accounting.bounds import Bound
from dpfl.accounting.pld import (
    _REBUILD_COARSER,
    Part,
    _CoarserGridNeeded,
    _part_plds,
    _part_uppers,
    _pmfs_of,
    bracket_parts,
)
from dpfl.errors import InvalidParameterError

__all__ = ["BracketResult", "refine_bound", "refine_parts", "start_discretization"]


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


#: The share of delta, per unit of the tolerance, the FFT error may take where
#: a smaller tilt shortens the composition (an error of a share ``r`` of delta
#: moves epsilon by about ``r / lambda``, ``lambda`` the slope of ``log
#: delta(epsilon)``: at 1e-2 of the tolerance it is invisible in the bracket).
_ERROR_SHARE = 1e-2


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
    threshold: float | None = None,
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
    threshold : float or None, optional
        With ``delta``: an epsilon bracket wholly at or below it, or wholly
        above it, is converged (a calibration's target: only the side
        matters; finer grids keep the bracket inside the first, so the side
        never changes).

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
        threshold=threshold,
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
    threshold: float | None = None,
) -> BracketResult:
    """:func:`refine_bound` for a composition of several distinct events.

    Parameters
    ----------
    build : callable
        ``h -> [(pld_upper, pld_lower, count), ...]``: each distinct event's
        one-round PLDs at grid step ``h`` and its count.
    delta, epsilon, tolerance, initial_discretization, max_grid_points, \
resolution, threshold
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
                parts,
                delta=delta,
                epsilon=epsilon,
                hint=known,
                error_share=min(_ERROR_SHARE * tolerance, 1e-4),
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
        resolved = _resolved(lo_v, hi_v, delta, resolution, threshold)
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
        converged = gap <= tolerance or resolved
        best = BracketResult(b, max(step, own), gap, converged, coarse)
        size = max(
            p.size for part in parts for u in _part_uppers(part) for p in _pmfs_of(u)
        )
        # A finer step cannot help once compositions are coarsened to fit the
        # memory cap, and the next step doubles the grid (the time model).
        # A finer grid that kept nine tenths of its predecessor's gap while
        # the lower value was informative: the analysis, not the grid, limits
        # the bracket (e.g. random participation's 'sound', whose lower end
        # is one configuration and upper the supremum over them), and each
        # further grid costs twice the last for a few per cent of the gap
        # (measured: T = 4286, sigma = 11.49, gaps 0.0102, 0.0063, 0.0050,
        # 0.0047, 0.0045, 0.0045 over six halvings, the last three 29 of 47 s).
        stalled = b.lower > 0 and own_gap > 0.9 * prev_gap
        prev_gap = own_gap
        if best.converged or coarse or stalled or 2 * size > max_grid_points:
            return best
        h /= 2.0


#: A delta bracket whose upper end is below this is resolved: the smallest
#: delta dpfl accepts is 1e-15, and refining a delta of 1e-26 towards a 2%
#: relative gap took 13 finer grids (34 s) for nothing anyone reads.
DELTA_FLOOR = 1e-18


def _resolved(
    lower: float,
    upper: float,
    delta: float | None,
    resolution: float,
    threshold: float | None = None,
) -> bool:
    """Whether a bracket is accurate enough whatever its relative width."""
    if delta is not None:  # an epsilon bracket
        if threshold is not None and (upper <= threshold or lower > threshold):
            return True
        return upper - lower <= resolution
    return upper <= DELTA_FLOOR


#: A grid step should resolve one round's losses: at most their standard
#: deviation over this, and their span over 4 times this.
_STEPS_PER_SCALE = 8


#: :func:`_scale` of each PMF still alive (a run asks about the same ones).
_SCALES: weakref.WeakKeyDictionary[pld_pmf.PLDPmf, float] = weakref.WeakKeyDictionary()


def _scale(pmf: pld_pmf.PLDPmf) -> float:
    """The largest grid step that resolves one PMF's losses (0 if a point)."""
    scale = _SCALES.get(pmf)
    if scale is None:
        scale = _SCALES[pmf] = _own_scale(pmf)
    return scale


def _own_scale(pmf: pld_pmf.PLDPmf) -> float:
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
