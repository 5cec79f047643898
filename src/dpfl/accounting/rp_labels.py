"""Random participation's one round as label mixtures of Gaussian-mixture pairs."""

from __future__ import annotations

import functools
import math
import threading

import numpy as np
from scipy import stats

from dpfl.accounting import discretise as _discretise
from dpfl.accounting import hockey as _hockey

_LABEL_CUT = 1e-30  # labels / components below this weight are dropped


def _binomial_weights(
    d: int, q: float, cut: float = _LABEL_CUT
) -> tuple[np.ndarray, np.ndarray, float]:
    """Labels ``i`` with ``Binom(i; d, q) >= cut``, their weights, dropped mass."""
    i = np.arange(d + 1)
    w = stats.binom.pmf(i, d, q) if d > 0 else np.ones(1)
    keep = np.nonzero(w >= cut * max(float(w.max()), 1e-300))[0]
    lo, hi = int(keep[0]), int(keep[-1])  # unimodal: the kept labels are a range
    # the mass outside from the tails themselves, not 1 - sum (whose rounding,
    # ~1e-16, composed over many rounds would swamp a delta of 1e-15)
    dropped = (
        float(stats.binom.cdf(lo - 1, d, q) + stats.binom.sf(hi, d, q)) if d else 0.0
    )
    return i[lo : hi + 1], w[lo : hi + 1], dropped


def _aligned(i: float, p: float, q: float) -> _hockey.MixturePair:
    """Companions' sum at ``i`` and the record pointing on: means (0, i, i + 1)."""
    return _hockey.MixturePair.create(
        [0.0, i, i + 1.0, 0.0, i],
        [1 - p, p * (1 - q), p * q, 0.0, 0.0],
        [0.0, 0.0, 0.0, 1 - p, p],
    )


def _anti_aligned(i: float, p: float, q: float) -> _hockey.MixturePair:
    """Companions' sum at ``i`` and the record pointing back: means (0, i, i - 1)."""
    return _hockey.MixturePair.create(
        [0.0, i, i - 1.0, 0.0, i],
        [1 - p, p * (1 - q), p * q, 0.0, 0.0],
        [0.0, 0.0, 0.0, 1 - p, p],
    )


def _worst_labels(
    p: float, q: float, d: int
) -> tuple[list[tuple[float, tuple[_hockey.MixturePair, _hockey.MixturePair]]], float]:
    """``sound``: per label, the two configurations whose maximum is the worst case.

    Label ``i`` (weight ``Binom(i; d, q)``) is the number of the client's other
    records that would be sampled. Its supremum curve over every gradient
    configuration is the pointwise maximum of the aligned and the anti-aligned
    pair's curves, in each direction (see the module docstring).
    """
    idx, w, dropped = _binomial_weights(d, q)
    labels = [
        (float(wi), (_aligned(float(i), p, q), _anti_aligned(float(i), p, q)))
        for i, wi in zip(idx, w)
    ]
    return labels, dropped


def _labels(
    analysis: str, p: float, q: float, d: int
) -> tuple[list[tuple[float, _hockey.MixturePair]], float]:
    """One round as a label mixture of Gaussian-mixture pairs (C = 1).

    For ``sound`` these are the aligned pairs (the remove direction's worst
    case and a real configuration, hence a lower bound in either direction).
    """
    mp = _hockey.MixturePair.create
    if analysis == "sound":
        idx, w, dropped = _binomial_weights(d, q)
        return [(float(wi), _aligned(float(i), p, q)) for i, wi in zip(idx, w)], dropped
    if analysis == "wcs":
        labels = [(p, mp([0.0, 1.0], [1 - q, q], [1.0, 0.0]))]
        if p < 1:
            labels.append((1 - p, mp([0.0], [1.0], [1.0])))
        return labels, 0.0
    if analysis == "ols":
        return [(1.0, mp([0.0, 1.0], [1 - q, q], [1.0, 0.0]))], 0.0
    if analysis == "cs":
        return [(1.0, mp([0.0, 1.0], [1 - p * q, p * q], [1.0, 0.0]))], 0.0
    # paper: the collinear pair P, Q of docs/analyses.md (one label)
    idx, w, dropped = _binomial_weights(d, q)
    w = w / math.fsum(w)
    means = np.concatenate([[0.0], idx, idx + 1.0, [0.0], idx, idx + 1.0])
    wp = np.concatenate([[1 - p], p * (1 - q) * w, p * q * w, [0.0], 0 * w, 0 * w])
    wq = np.concatenate([[0.0], 0 * w, 0 * w, [1 - p], p * w, 0 * w])
    return [(1.0, mp(means, wp, wq))], dropped


class _RoundCurves:
    """One round's hockey-stick curves under an analysis, each epsilon once.

    A curve's value at an epsilon does not depend on the grid, but a query
    builds one round's PLDs many times: its upper and its lower PLD (priced
    separately), at every step of the refinement and after the rebuild on
    the losses' own scale. Each build searches the loss range at the same
    396 epsilons and evaluates the curve on support points that largely
    repeat those of the other builds. This object keeps every value computed
    (exact values, so the PLDs built from them are those built without it)
    and evaluates only the epsilons it has not seen. For ``sound`` one
    evaluation of the aligned and anti-aligned pairs at an epsilon gives the
    upper curve (their per-label maximum) and the lower one (the aligned
    mixture removing, the anti-aligned one adding) together.

    Upper curves return ``(delta, nan, nan, P(L <= eps))`` for ``sound`` (see
    :func:`dpfl.accounting.discretise.pld_bounds_from_curves`), all four outputs of
    the label mixture otherwise; :meth:`lower` is None where the upper
    curves are those of a real pair.
    """

    #: Stored epsilons per direction past which the memory is cleared.
    MAX_POINTS = 400_000

    def __init__(self, analysis: str, p: float, q: float, d: int, sigma: float):
        self.sigma = sigma
        self.sound = analysis == "sound"
        if self.sound:
            self.worst, self.dropped = _worst_labels(p, q, d)
        else:
            self.labels, self.dropped = _labels(analysis, p, q, d)
        # per direction (swap): epsilon -> 8 values, upper then lower outputs
        self._memo: dict[bool, dict[float, tuple[float, ...]]] = {
            False: {},
            True: {},
        }
        self._lock = threading.Lock()

    def _compute(self, e: np.ndarray, swap: bool) -> np.ndarray:
        """Rows of 8 values at the epsilons ``e`` (upper's 4, lower's 4)."""
        if not self.sound:
            out = _hockey.label_mixture_delta(
                self.labels, e, noise_std=self.sigma, swap=swap
            )
            return np.asarray(np.vstack([*out, *out]).T)
        dlt, p_out, each = _hockey.label_candidates_delta(
            self.worst, e, noise_std=self.sigma, swap=swap
        )
        nan = np.full(e.size, np.nan)
        lower = each[1 if swap else 0]  # anti-aligned adding, aligned removing
        return np.asarray(np.vstack([dlt, nan, nan, p_out, *lower]).T)

    def _values(self, e: np.ndarray, swap: bool) -> np.ndarray:
        memo = self._memo[swap]
        keys = np.asarray(e, dtype=float).ravel().tolist()
        with self._lock:
            missing = sorted({k for k in keys if k not in memo})
            if missing:
                if len(memo) + len(missing) > self.MAX_POINTS:
                    memo.clear()
                rows = self._compute(np.array(missing), swap)
                memo.update(zip(missing, map(tuple, rows.tolist())))
            return np.array([memo[k] for k in keys]).reshape(len(keys), 8)

    def upper(self, swap: bool) -> _discretise.CurveFn:
        """The upper curve of one direction (``swap``: adding the record)."""

        def curve(e: np.ndarray) -> tuple[np.ndarray, ...]:
            v = self._values(e, swap)
            return v[:, 0], v[:, 1], v[:, 2], v[:, 3]

        return curve  # type: ignore[return-value]

    def lower(self, swap: bool) -> _discretise.CurveFn | None:
        """The lower curve (a real configuration), None if the upper is one."""
        if not self.sound:
            return None

        def curve(e: np.ndarray) -> tuple[np.ndarray, ...]:
            v = self._values(e, swap)
            return v[:, 4], v[:, 5], v[:, 6], v[:, 7]

        return curve  # type: ignore[return-value]


@functools.lru_cache(maxsize=4)
def _round_curves(
    analysis: str, p: float, q: float, d: int, sigma: float
) -> _RoundCurves:
    """The shared :class:`_RoundCurves` of a scheme (the last few are kept)."""
    return _RoundCurves(analysis, p, q, d, sigma)
