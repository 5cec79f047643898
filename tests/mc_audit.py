"""Monte-Carlo lower bounds on the hockey-stick divergence delta(epsilon).

A reusable test helper: given samples of one or more scalar statistics of a
mechanism's output under two neighbouring worlds A and B, return a lower bound
on

    delta_{A||B}(epsilon) = sup_S  P_A(S) - e^epsilon P_B(S)

that holds with a stated confidence, using exact Clopper-Pearson intervals.
Any such bound is also a lower bound on the mechanism's delta(epsilon) for the
neighbouring relation that relates A and B (the supremum over *all* output
sets, and over both directions when the relation is symmetric), so a priced
delta below it is refuted.

Only numpy and scipy are used; everything is vectorised.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import numpy as np
from scipy import stats

__all__ = [
    "AuditResult",
    "clopper_pearson",
    "delta_lower_bound",
    "gaussian_delta",
]


def gaussian_delta(mu: float, epsilon: float) -> float:
    """Exact delta(epsilon) of the Gaussian mechanism N(0, 1) vs N(mu, 1).

    ``Phi(mu/2 - epsilon/mu) - e^epsilon Phi(-mu/2 - epsilon/mu)`` (Balle &
    Wang 2018, Theorem 8); symmetric in the two directions. ``mu = 0`` gives 0.
    """
    if mu <= 0:
        return 0.0
    a = mu / 2 - epsilon / mu
    b = -mu / 2 - epsilon / mu
    return max(0.0, float(stats.norm.cdf(a) - math.exp(epsilon) * stats.norm.cdf(b)))


def clopper_pearson(
    successes: np.ndarray | int, trials: int, alpha: float
) -> tuple[np.ndarray, np.ndarray]:
    """One-sided exact Clopper-Pearson bounds, each at level ``alpha``.

    Parameters
    ----------
    successes : int or array of int
        Number of successes ``k`` (``0 <= k <= trials``).
    trials : int
        Number of Bernoulli trials ``n >= 1``.
    alpha : float
        Error probability of *each* one-sided bound, in (0, 1).

    Returns
    -------
    lower, upper : ndarray
        ``P(p < lower) <= alpha`` and ``P(p > upper) <= alpha`` for every true
        success probability ``p``: ``lower`` is the ``alpha`` quantile of
        Beta(k, n - k + 1) (0 if k = 0), ``upper`` the ``1 - alpha`` quantile
        of Beta(k + 1, n - k) (1 if k = n).
    """
    k = np.asarray(successes, dtype=float)
    n = float(trials)
    with np.errstate(invalid="ignore", divide="ignore"):
        lower = np.where(k > 0, stats.beta.ppf(alpha, k, n - k + 1), 0.0)
        upper = np.where(k < n, stats.beta.ppf(1 - alpha, k + 1, n - k), 1.0)
    return np.asarray(lower, dtype=float), np.asarray(upper, dtype=float)


@dataclasses.dataclass(frozen=True)
class AuditResult:
    """A lower confidence bound on delta(epsilon) and how it was obtained.

    Attributes
    ----------
    epsilon : float
        The epsilon the bound is for.
    delta_lower : float
        ``max(0, lower_first - e^epsilon * upper_second)``: with probability at
        least ``confidence``, ``delta_lower <= delta_{direction}(epsilon)``.
    confidence : float
        The confidence level ``1 - alpha`` of ``delta_lower``.
    estimate : float
        The plain estimate ``p_first - e^epsilon p_second`` on the evaluation
        half for the selected set (no confidence attached; may exceed the truth).
    direction : str
        ``"A||B"`` (S favours world A) or ``"B||A"`` (roles swapped).
    statistic : int
        Index of the selected statistic: ``j < m`` is column ``j`` of the
        samples, ``m + j`` the binned likelihood ratio of column ``j``.
    side : str
        ``">"`` for the set ``{T > threshold}``, ``"<"`` for ``{T < threshold}``.
    threshold : float
        The selected threshold (chosen on the selection half only).
    p_first, p_second : float
        Empirical probabilities of the set under the first and second world of
        ``direction`` on the evaluation half.
    lower_first, upper_second : float
        Their one-sided Clopper-Pearson bounds, each at level ``alpha / 2``.
    n_first, n_second : int
        Evaluation sample sizes.
    """

    epsilon: float
    delta_lower: float
    confidence: float
    estimate: float
    direction: str
    statistic: int
    side: str
    threshold: float
    p_first: float
    p_second: float
    lower_first: float
    upper_second: float
    n_first: int
    n_second: int


def _as_columns(samples: np.ndarray, name: str) -> np.ndarray:
    x = np.asarray(samples, dtype=float)
    if x.ndim == 1:
        x = x[:, None]
    if x.ndim != 2 or x.shape[0] < 4 or x.shape[1] < 1:
        raise ValueError(f"{name} must have shape (n,) or (n, m) with n >= 4")
    if np.isnan(x).any():
        raise ValueError(f"{name} contains NaN")
    return x


def _set_counts(
    sorted_first: np.ndarray,
    sorted_second: np.ndarray,
    thresholds: np.ndarray,
    side: str,
) -> tuple[np.ndarray, np.ndarray]:
    """Counts of {T > t} or {T < t} in two sorted samples, for every t."""
    if side == ">":
        k1 = sorted_first.size - np.searchsorted(sorted_first, thresholds, "right")
        k2 = sorted_second.size - np.searchsorted(sorted_second, thresholds, "right")
    else:
        k1 = np.searchsorted(sorted_first, thresholds, "left")
        k2 = np.searchsorted(sorted_second, thresholds, "left")
    return k1, k2


def _candidate_thresholds(
    sorted_a: np.ndarray, sorted_b: np.ndarray, max_thresholds: int
) -> np.ndarray:
    """Evenly spaced order statistics of both samples, each +-1 ulp."""
    picks = []
    for x in (sorted_a, sorted_b):
        k = min(x.size, max(2, max_thresholds // 2))
        picks.append(x[np.unique(np.linspace(0, x.size - 1, k).astype(np.int64))])
    grid = np.concatenate(picks)
    with np.errstate(over="ignore"):
        grid = np.concatenate(
            [grid, np.nextafter(grid, np.inf), np.nextafter(grid, -np.inf)]
        )
    return np.unique(grid)


def _binned_llr(
    first: np.ndarray, second: np.ndarray, bins: int
) -> Callable[[np.ndarray], np.ndarray]:
    """Map a statistic to log(f_first / f_second) of smoothed bin frequencies.

    Bin edges are pooled quantiles of the two samples; a value equal to an edge
    (an atom) gets its own bin (index ``2i + 1``), values strictly between two
    edges share one (index ``2i``).
    """
    pooled = np.concatenate([first, second])
    levels = np.linspace(0.0, 1.0, bins + 1)
    # "lower": edges are sample values (no interpolation between infinities)
    edges = np.unique(np.quantile(pooled, levels, method="lower"))

    def index(x: np.ndarray) -> np.ndarray:
        right = np.searchsorted(edges, x, "right")
        atom = (right > 0) & (edges[np.maximum(right - 1, 0)] == x)
        return 2 * right - atom

    size = 2 * edges.size + 1
    c1 = np.bincount(index(first), minlength=size) + 0.5
    c2 = np.bincount(index(second), minlength=size) + 0.5
    llr = np.log(c1 / c1.sum()) - np.log(c2 / c2.sum())

    def transform(x: np.ndarray) -> np.ndarray:
        return llr[index(x)]

    return transform


def delta_lower_bound(
    samples_a: np.ndarray,
    samples_b: np.ndarray,
    epsilon: float,
    *,
    confidence: float = 0.999,
    direction: str = "both",
    selection_fraction: float = 0.5,
    bins: int = 200,
    max_thresholds: int = 20_000,
) -> AuditResult:
    r"""Lower confidence bound on delta(epsilon) from samples of two worlds.

    Parameters
    ----------
    samples_a, samples_b : array_like, shape (n,) or (n, m)
        I.i.d. samples of ``m`` scalar statistics of the mechanism's output in
        world A and in world B (independent of each other; ``n`` may differ
        between worlds, ``m`` may not). ``-inf`` / ``inf`` are allowed (e.g.
        to encode "no message"), NaN is not.
    epsilon : float
        The epsilon at which delta is bounded.
    confidence : float, optional
        ``1 - alpha``: the probability that the returned bound does not exceed
        the true divergence (default 0.999).
    direction : {"both", "A||B", "B||A"}, optional
        ``"A||B"`` bounds ``sup_S P_A(S) - e^eps P_B(S)``; ``"B||A"`` swaps the
        worlds; ``"both"`` (default) lets the selection half pick the
        direction, which bounds ``max`` of the two, i.e. delta(epsilon) of a
        symmetric neighbouring relation.
    selection_fraction : float, optional
        Fraction of each world's samples (the first ones) used to choose the
        set; the rest evaluate it (default 0.5).
    bins : int, optional
        Also try, for every statistic, its *binned likelihood ratio*: the
        selection half's pooled quantiles cut the statistic into about ``bins``
        bins (each value that is a quantile, such as an atom at 0, gets a bin
        of its own) and every output is scored by the log ratio of the two
        worlds' smoothed bin frequencies *on the selection half*. Thresholding
        that score yields unions of bins, i.e. approximately the
        Neyman-Pearson sets of the statistic even when its likelihood ratio
        is not monotone. ``0`` disables it (plain threshold sets only).
    max_thresholds : int, optional
        Candidate thresholds per statistic: about ``max_thresholds / 2``
        evenly spaced order statistics of each world's selection half (all of
        them if fewer), each also nudged one ulp up and down so that sets
        ``{T >= t}`` and ``{T <= t}`` at atoms are available. The resolution
        is thus about ``2 / max_thresholds`` in probability.

    Returns
    -------
    AuditResult
        ``delta_lower`` and the set (statistic, side, threshold, direction)
        that produced it.

    Notes
    -----
    Candidate sets are ``{T_j > t}`` and ``{T_j < t}`` for every statistic
    ``j`` (the given columns, then their binned likelihood ratios if
    ``bins > 0``), every candidate threshold ``t`` (selection-half values), and
    (with ``direction="both"``) both directions. The set maximising a pessimistic
    estimate of ``P_1(S) - e^eps P_2(S)`` *on the selection half* is chosen
    (the estimate subtracts about ``z`` binomial standard deviations, with
    ``z`` the normal quantile of the confidence, so sets with few hits are
    not preferred by chance). This choice is a function of the selection half
    only, so conditionally on it ``S`` is a fixed set and the evaluation half
    gives independent binomial counts ``k_1 ~ Bin(n_1, P_1(S))`` and
    ``k_2 ~ Bin(n_2, P_2(S))``. With one-sided exact Clopper-Pearson bounds
    at level ``alpha/2`` each,

    .. math:: P(P_1(S) < L_1) \le \alpha/2, \quad P(P_2(S) > U_2) \le \alpha/2,

    so by Bonferroni's inequality, with probability at least ``1 - alpha``,

    .. math:: L_1 - e^\varepsilon U_2 \le P_1(S) - e^\varepsilon P_2(S)
              \le \sup_S P_1(S) - e^\varepsilon P_2(S) = \delta_{1\|2}(\varepsilon).

    The bound is clipped at 0 (always a valid lower bound). It holds
    conditionally on the selection half, hence unconditionally; no
    multiple-comparison correction for the many candidate sets is needed
    because only the one selected set is evaluated. Consequently a test that
    asserts ``delta_lower <= delta_true`` fails with probability at most
    ``alpha`` (the false-alarm probability), and a test that asserts
    ``delta_lower > delta_priced`` proves, at confidence ``1 - alpha``, that
    the priced delta is too small. A statistic that is a measurable function
    of the output only lowers the attacker's power, never the validity.
    """
    if not 0 < confidence < 1:
        raise ValueError("confidence must be in (0, 1)")
    if direction not in ("both", "A||B", "B||A"):
        raise ValueError("direction must be 'both', 'A||B' or 'B||A'")
    if not 0 < selection_fraction < 1:
        raise ValueError("selection_fraction must be in (0, 1)")
    xa = _as_columns(samples_a, "samples_a")
    xb = _as_columns(samples_b, "samples_b")
    if xa.shape[1] != xb.shape[1]:
        raise ValueError("samples_a and samples_b must have the same statistics")
    alpha = 1.0 - confidence
    factor = math.exp(epsilon)
    z = float(stats.norm.isf(alpha / 2))

    sa = max(1, min(xa.shape[0] - 1, int(round(selection_fraction * xa.shape[0]))))
    sb = max(1, min(xb.shape[0] - 1, int(round(selection_fraction * xb.shape[0]))))
    m = xa.shape[1]
    sel = {"A": xa[:sa], "B": xb[:sb]}
    ev = {"A": xa[sa:], "B": xb[sb:]}
    maps: list[Callable[[np.ndarray], np.ndarray]] = []
    if bins > 0:
        # binned likelihood ratios: built from the selection half only
        maps = [_binned_llr(sel["A"][:, j], sel["B"][:, j], bins) for j in range(m)]
        for w in ("A", "B"):
            sel[w] = np.column_stack(
                [sel[w]] + [f(sel[w][:, j]) for j, f in enumerate(maps)]
            )
    pairs = {"A||B": ("A", "B"), "B||A": ("B", "A")}
    directions = list(pairs) if direction == "both" else [direction]

    best: tuple[float, str, int, str, float] | None = None
    for j in range(sel["A"].shape[1]):
        cols = {w: np.sort(sel[w][:, j]) for w in sel}
        thresholds = _candidate_thresholds(cols["A"], cols["B"], max_thresholds)
        for dname in directions:
            first, second = pairs[dname]
            n1, n2 = cols[first].size, cols[second].size
            for side in (">", "<"):
                k1, k2 = _set_counts(cols[first], cols[second], thresholds, side)
                # pessimistic (normal-approximation) estimate for the selection
                score = (k1 - z * np.sqrt(k1 + 1.0)) / n1 - factor * (
                    k2 + z * np.sqrt(k2 + 1.0) + 1.0
                ) / n2
                i = int(np.argmax(score))
                if best is None or score[i] > best[0]:
                    best = (float(score[i]), dname, j, side, float(thresholds[i]))
    assert best is not None
    _, dname, j, side, t = best

    first, second = pairs[dname]
    if j < m:
        e1, e2 = ev[first][:, j], ev[second][:, j]
    else:
        e1, e2 = maps[j - m](ev[first][:, j - m]), maps[j - m](ev[second][:, j - m])
    hits1 = int(np.count_nonzero(e1 > t if side == ">" else e1 < t))
    hits2 = int(np.count_nonzero(e2 > t if side == ">" else e2 < t))
    lo1, _ = clopper_pearson(hits1, e1.size, alpha / 2)
    _, up2 = clopper_pearson(hits2, e2.size, alpha / 2)
    p1 = hits1 / e1.size
    p2 = hits2 / e2.size
    return AuditResult(
        epsilon=float(epsilon),
        delta_lower=max(0.0, float(lo1) - factor * float(up2)),
        confidence=float(confidence),
        estimate=p1 - factor * p2,
        direction=dname,
        statistic=j,
        side=side,
        threshold=t,
        p_first=p1,
        p_second=p2,
        lower_first=float(lo1),
        upper_second=float(up2),
        n_first=int(e1.size),
        n_second=int(e2.size),
    )
