"""Random participation: DP-DSGD where clients join w.p. p and records w.p. q.

Scheme (Hasircioglu & Gündüz, arXiv 2205.01556, Algorithm 1; docs/analyses.md):
per round each client joins independently with probability ``p``; a joining
client samples each of its ``d`` records with probability ``q``, clips every
per-record gradient to norm ``C = 1`` and sends the sum; a trusted server
adds ``N(0, sigma^2 I)`` to the total. Record-level, add/remove; the adversary
sees the noisy aggregate, not who took part.

Analyses (``ANALYSES``, the default first; statuses in
:data:`dpfl.accounting.schemes.RANDOM_PARTICIPATION`):

``"sound"`` (default, proven)
    The *two-sided conditional pair*. The adversary is given, for free, the
    set ``S_1`` of the neighbouring client's other records that would be
    sampled (drawn whether or not the client takes part, so its law is the
    same under both datasets) and every other client's contribution; the
    real output is a post-processing of that view, so by joint convexity of
    the hockey-stick divergence one round is bounded by the mixture over the
    public label ``i = |S_1| ~ Binomial(d, q)`` of the worst pair for that
    label. With ``mu`` the companions' sum (``||mu|| <= i``) and ``g'`` the
    record's gradient (``||g'|| <= 1``), the pair is
    ``W = (1-p) N(0) + p(1-q) N(mu) + pq N(mu + g')`` against
    ``O = (1-p) N(0) + p N(mu)``. Two lemmas fix its worst case for every
    ``alpha = e^eps >= 1``:

    * an *angle* lemma: ``E psi(a e^S + b e^T)`` with ``psi(s) = (1 - s)_+``
      convex, ``(S, T)`` bivariate normal with fixed marginals, grows with the
      correlation, because ``psi(a e^s + b e^t)`` is supermodular (Tchen 1980;
      Müller & Scarsini 2000);
    * a *norm* lemma: ``int (phi(w) - a phi(w + s) - b phi(w + t))_+ dw``
      grows in ``s, t >= 0`` (the likelihood ratios are monotone, so the
      positive set is a half-line).

    Remove direction (``D_alpha(W || O)``): the worst case is the **aligned**
    pair, means ``(0, i, i + 1)``. Add direction (``D_alpha(O || W)``): the
    **anti-aligned** pair, means ``(0, i, i - 1)``. Since
    ``D_alpha(W || O) = 1 - alpha + alpha D_{1/alpha}(O || W)``, the curve of
    each direction at every real eps is the pointwise maximum of the two
    pairs' curves: the exact supremum over configurations, convex in alpha,
    hence the curve of a pair. Connect-the-dots (Doroshenko et al. 2022)
    turns the label-mixed curve into a discrete dominating pair, valid for
    every alpha and independent of the history, so T rounds compose
    adaptively (Zhu, Dong & Wang 2022). The lower bracket composes the
    aligned label mixture (remove) and the anti-aligned one (add), real
    configurations that this pair dominates. The proof, written out, is in
    docs/systems/random-participation.md.
``"wcs"`` (proven, looser)
    Participation visible (Theorem 5.2): w.p. p a Poisson-subsampled Gaussian
    at rate q, else nothing. Valid for every configuration with no lemma:
    giving the adversary who took part (and the companions' sum) is a
    relaxation of the real mechanism.
``"paper"``
    Theorem 4.1 as printed: ``D_{e^eps}(P || Q)`` of the collinear pair, which
    is *not* a valid worst case (see :data:`PAPER_WARNING`).
``"ols"``, ``"cs"``
    Baselines: Poisson-subsampled Gaussian at rate q (OLS, p = 1; valid and
    loose) and at rate pq (CS, central shuffling; what zero companion
    gradients give, hence a lower bound on the worst case, not an upper one).

``records_per_client`` is the number ``d`` of the neighbouring client's
*other* records; with clients of unequal sizes, price the largest (the
epsilon grows with ``d``, see :func:`epsilon`).

Per-round values use the closed forms of docs/analyses.md (ols, wcs, cs: remove
direction; paper: Theorem 4.1 with every root) and take the maximum with the
add direction computed exactly; ``sound`` uses the label mixture of per-label
worst cases. Composition
over rounds uses :mod:`dpfl.accounting.pld` (upper and lower bounds).

A surprise worth recording: the WCS closed form of Theorem 5.2 coincides with
the exact hockey-stick divergence of "w.p. p a subsampled Gaussian at rate
q" (checked in the tests), even though it is written with the rate-pq
``eps'`` of Theorem 4.1.
"""

from __future__ import annotations

import functools
import math
import threading
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
from dp_accounting.pld.privacy_loss_distribution import PrivacyLossDistribution
from scipy import optimize, special, stats

from dpfl._validate import (
    check_count,
    check_delta,
    check_nonnegative,
    check_positive,
    check_probability,
)
from dpfl.accounting import discretise as _discretise
from dpfl.accounting import events as ev
from dpfl.accounting import hockey as _hockey
from dpfl.accounting import pricing
from dpfl.accounting import refine as _refine
from dpfl.accounting.bounds import Bound
from dpfl.errors import InvalidParameterError, UnsupportedEventError

__all__ = [
    "ANALYSES",
    "PAPER_WARNING",
    "configuration_search_lower_bound",
    "delta",
    "epsilon",
    "participation_pld",
    "round_delta",
    "round_epsilon",
    "start_step",
]

ANALYSES = ("sound", "wcs", "ols", "paper", "cs")

PAPER_WARNING = (
    "Theorem 4.1 of Hasircioglu & Gunduz is not a valid worst-case DP bound "
    "(Hasircioglu & Gunduz, arXiv 2205.01556): it assumes the neighbouring "
    "client's other sampled records have full-norm gradients collinear with the "
    "target record's, which hides the record among them; zero or angled "
    "companion gradients leak more (with zero gradients the mechanism is the "
    "rate-pq subsampled Gaussian). dpfl reports it for comparison only; the "
    "default analysis 'sound' (the two-sided conditional pair) is a proven bound."
)

_LABEL_CUT = 1e-30  # labels / components below this weight are dropped


# --------------------------------------------------------------------------
# validation
# --------------------------------------------------------------------------


def _check_scheme(
    participation_probability: float,
    record_probability: float,
    records_per_client: int,
    analysis: str,
) -> tuple[float, float, int, str]:
    p = check_probability("participation_probability", participation_probability)
    q = check_probability("record_probability", record_probability)
    d = check_count("records_per_client", records_per_client, minimum=0)
    if analysis not in ANALYSES:
        raise InvalidParameterError(
            f"analysis must be one of {ANALYSES}; got {analysis!r}"
        )
    return p, q, d, analysis


# --------------------------------------------------------------------------
# closed forms (docs/analyses.md)
# --------------------------------------------------------------------------


def _gaussian_delta(eps: float, sigma: float) -> float:
    """Balle-Wang Thm 8 with C = 1: Phi(1/2s - eps s) - e^eps Phi(-1/2s - eps s)."""
    a = 0.5 / sigma - eps * sigma
    b = -0.5 / sigma - eps * sigma
    first = special.ndtr(a)
    second = math.exp(eps + special.log_ndtr(b)) if eps < 700 else 0.0
    return max(0.0, float(first - second))


def _subsampled_delta(eps: float, rate: float, sigma: float) -> float:
    """Remove direction of the rate-``rate`` Poisson-subsampled Gaussian (exact)."""
    eps_prime = math.log1p(math.expm1(eps) / rate)
    return rate * _gaussian_delta(eps_prime, sigma)


def _wcs_delta(eps: float, p: float, q: float, sigma: float) -> float:
    """Theorem 5.2 (WCS)."""
    pq = p * q
    eps_prime = math.log1p(math.expm1(eps) / pq)
    beta = math.exp(eps - eps_prime)
    inner = beta + (1.0 - beta) * p * (1.0 - q) / (1.0 - pq) if pq < 1 else beta
    eps2 = eps_prime + math.log(inner)
    return pq * _gaussian_delta(eps2, sigma)


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


def _paper_theorem_delta(eps: float, p: float, q: float, d: int, sigma: float) -> float:
    """Theorem 4.1 literally: pq * integral of the bracket's positive part."""
    pq = p * q
    eps_prime = math.log1p(math.expm1(eps) / pq)
    alpha = math.exp(eps_prime)
    beta = math.exp(eps - eps_prime)
    c1 = (1.0 - beta) * (1.0 - p) / (1.0 - pq) if pq < 1 else 0.0
    c2 = ((1.0 - beta) * p * (1.0 - q) / (1.0 - pq) if pq < 1 else 0.0) + beta
    idx, w, _ = _binomial_weights(d, q)
    # integrand: sum_i w_i phi(z - i - 1) - alpha c2 sum_i w_i phi(z - i)
    #            - alpha c1 phi(z)
    means = np.concatenate([idx + 1.0, idx.astype(float), [0.0]])
    coef = np.concatenate([w, -alpha * c2 * w, [-alpha * c1]])
    uniq, inv = np.unique(means, return_inverse=True)
    c = np.zeros(uniq.size)
    np.add.at(c, inv, coef)
    # express as (a, b) with a - b = c at x = e^0 = 1 for _hockey_rows
    a = np.maximum(c, 0.0)[None, :]
    b = np.maximum(-c, 0.0)[None, :]
    dlt, _, _, _ = _hockey._hockey_rows(  # pylint: disable=protected-access
        uniq[None, :], a, b, a - b, np.zeros(1), sigma
    )
    return float(pq * dlt[0])


# --------------------------------------------------------------------------
# label mixtures for every analysis
# --------------------------------------------------------------------------


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


def _add_direction_delta(
    eps: float, analysis: str, p: float, q: float, d: int, sigma: float
) -> float:
    labels, _ = _labels(analysis, p, q, d)
    return float(
        _hockey.label_mixture_delta(labels, [eps], noise_std=sigma, swap=True)[0][0]
    )


DIRECTIONS = ("both", "remove", "add")


def _round_delta(
    eps: float,
    analysis: str,
    p: float,
    q: float,
    d: int,
    sigma: float,
    direction: str = "both",
) -> float:
    if analysis == "paper" and direction == "both":
        # the theorem as printed: its remove direction, every root
        return _paper_theorem_delta(eps, p, q, d, sigma)
    if analysis == "sound":
        rc = _round_curves(analysis, p, q, d, sigma)
        e = np.array([eps])
        rem, add = (
            float(rc.upper(swap)(e)[0][0]) + rc.dropped for swap in (False, True)
        )
    else:
        add = _add_direction_delta(eps, analysis, p, q, d, sigma)
        if analysis == "wcs":
            rem = _wcs_delta(eps, p, q, sigma)
        elif analysis == "ols":
            rem = _subsampled_delta(eps, q, sigma)
        elif analysis == "cs":
            rem = _subsampled_delta(eps, p * q, sigma)
        else:
            rem = _paper_theorem_delta(eps, p, q, d, sigma)
    value = {"remove": rem, "add": add, "both": max(rem, add)}[direction]
    return min(1.0, value)


def round_delta(
    epsilon: float,
    *,
    participation_probability: float,
    record_probability: float,
    records_per_client: int,
    noise_multiplier: float,
    analysis: str = "sound",
    direction: str = "both",
) -> float:
    """Per-round delta(epsilon) of random participation under one analysis.

    Parameters
    ----------
    epsilon : float
        Per-round epsilon (>= 0).
    participation_probability : float
        Client participation probability p in (0, 1].
    record_probability : float
        Record sampling probability q in (0, 1].
    records_per_client : int
        Number d >= 0 of the neighbouring client's other records.
    noise_multiplier : float
        Noise standard deviation on the sum of gradients clipped to C = 1.
    analysis : str, optional
        One of :data:`ANALYSES` (default ``"sound"``, the tightest proven).
    direction : str, optional
        ``"remove"`` (``D_{e^eps}`` of the output with the record against the
        output without it), ``"add"`` (the reverse) or ``"both"`` (default,
        their maximum).

    Returns
    -------
    float
        The per-round delta (``"paper"`` with ``"both"``: Theorem 4.1 as
        printed, with every root, i.e. its remove direction).

    Raises
    ------
    InvalidParameterError
        If a parameter is out of range or the analysis is unknown.

    References
    ----------
    Hasircioglu & Gündüz, "Communication efficient federated learning with
    differential privacy and random participation", arXiv 2205.01556,
    Theorems 4.1, 5.1, 5.2, Corollary 5.3; docs/analyses.md.
    """
    p, q, d, analysis = _check_scheme(
        participation_probability, record_probability, records_per_client, analysis
    )
    eps = check_nonnegative("epsilon", epsilon)
    sigma = check_positive("noise_multiplier", noise_multiplier)
    if direction not in DIRECTIONS:
        raise InvalidParameterError(
            f"direction must be one of {DIRECTIONS}; got {direction!r}"
        )
    return _round_delta(eps, analysis, p, q, d, sigma, direction)


def round_epsilon(
    delta: float,
    *,
    participation_probability: float,
    record_probability: float,
    records_per_client: int,
    noise_multiplier: float,
    analysis: str = "sound",
) -> float:
    """Smallest per-round epsilon with ``round_delta(epsilon) <= delta``.

    Parameters
    ----------
    delta : float
        Target delta in (0, 1).
    participation_probability, record_probability, records_per_client, \
noise_multiplier, analysis
        As in :func:`round_delta`.

    Returns
    -------
    float
        The per-round epsilon (to ~1e-12 relative).

    Raises
    ------
    InvalidParameterError
        If a parameter is out of range or the analysis is unknown.
    """
    p, q, d, analysis = _check_scheme(
        participation_probability, record_probability, records_per_client, analysis
    )
    target = check_delta("delta", delta)
    sigma = check_positive("noise_multiplier", noise_multiplier)

    def f(e: float) -> float:
        return _round_delta(e, analysis, p, q, d, sigma) - target

    if f(0.0) <= 0:
        return 0.0
    hi = 0.01
    while f(hi) > 0:
        hi *= 2.0
        if hi > 700:
            raise InvalidParameterError(
                f"no epsilon below 700 reaches delta={delta!r} for this scheme"
            )
    return float(
        optimize.brentq(f, hi / 2 if hi > 0.01 else 0.0, hi, xtol=1e-14, rtol=1e-12)
    )


# --------------------------------------------------------------------------
# PLDs and composition
# --------------------------------------------------------------------------

_DEFAULT_H = 1e-5
#: One round's loss range is cut where less than this mass lies beyond (to
#: +infinity above, pessimistically): small enough that 1e5 rounds of it stay
#: far below a delta of 1e-15.
_TAIL_MASS = 1e-24


def start_step(rounds: int, tolerance: float) -> float:
    """First grid step of a bracket's refinement (1e-5 up to 1e4 rounds).

    Parameters
    ----------
    rounds : int
        Rounds composed.
    tolerance : float
        The bracket's target relative gap.

    Returns
    -------
    float
        The step.

    Notes
    -----
    One round's losses are small (most mass within about ``p q`` of 0), so
    the generic second-order rule (:func:`dpfl.accounting.refine.start_discretization`)
    starts far too coarse here and refines many times; 1e-5 converges in one or
    two steps at 1e4 rounds (measured: 3 s against 7 s). The composed PMF grows
    with the rounds over the step, so the step grows with sqrt(rounds) beyond
    1e4 (never coarser than the generic rule).
    """
    return float(
        min(
            _refine.start_discretization(tolerance),
            _DEFAULT_H * max(1.0, math.sqrt(rounds / 1e4)),
        )
    )


def _relative_spacing(h: float) -> float:
    """Support-point spacing tied to the grid: halving h halves every gap.

    Floored at 3e-3: grids finer than 1e-6 only come from tiny losses (the
    own-scale rebuild), where the bracket is limited by the grid, not by
    the spacing, and a spacing of 3000 h made the support grow as 1/h (a
    query at h = 3e-9: 61 s CPU, now 10 s, the same bracket to 1e-6).
    """
    return float(min(0.05, max(3000.0 * h, 3e-3)))


def participation_pld(
    *,
    participation_probability: float,
    record_probability: float,
    records_per_client: int,
    noise_multiplier: float,
    analysis: str = "sound",
    value_discretization: float = _DEFAULT_H,
    pessimistic: bool = True,
) -> PrivacyLossDistribution:
    """One round's privacy-loss distribution (both directions).

    Parameters
    ----------
    participation_probability, record_probability, records_per_client, \
noise_multiplier, analysis
        As in :func:`round_delta`.
    value_discretization : float, optional
        Grid step of the privacy loss (support gaps scale with it).
    pessimistic : bool, optional
        True: certified upper bound (connect-the-dots). False: lower bound
        (a garbling of the true pair).

    Returns
    -------
    dp_accounting.pld.privacy_loss_distribution.PrivacyLossDistribution
        ``pmf_remove`` for (with record, without), ``pmf_add`` for the reverse.

    Raises
    ------
    InvalidParameterError
        If a parameter is out of range or the analysis is unknown.
    """
    p, q, d, analysis = _check_scheme(
        participation_probability, record_probability, records_per_client, analysis
    )
    sigma = check_positive("noise_multiplier", noise_multiplier)
    h = check_positive("value_discretization", value_discretization)
    up, lo = _builder(analysis, p, q, d, sigma, which=(pessimistic,))(h)
    return up if pessimistic else lo


def _builder(
    analysis: str,
    p: float,
    q: float,
    d: int,
    sigma: float,
    which: tuple[bool, ...] = (True, False),
) -> Callable[[float], tuple[PrivacyLossDistribution, PrivacyLossDistribution]]:
    rc = _round_curves(analysis, p, q, d, sigma)
    upper = (rc.upper(False), rc.upper(True))
    lo_rem, lo_add = rc.lower(False), rc.lower(True)
    lower = None if lo_rem is None or lo_add is None else (lo_rem, lo_add)
    dropped = rc.dropped

    def build(h: float) -> tuple[PrivacyLossDistribution, PrivacyLossDistribution]:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return _discretise.pld_bounds_from_curves(
                upper,
                lower,
                value_discretization=h,
                dropped_mass=dropped,
                relative_spacing=_relative_spacing(h),
                tail_mass=_TAIL_MASS,
                which=which,
            )

    return build


def epsilon(
    delta: float,
    *,
    rounds: int,
    participation_probability: float,
    record_probability: float,
    records_per_client: int,
    noise_multiplier: float,
    analysis: str = "sound",
    tolerance: float = 0.02,
    resolution: float = 0.0,
) -> Bound:
    """Epsilon after ``rounds`` rounds, bracketed by upper and lower PLDs.

    Parameters
    ----------
    delta : float
        Target delta in (0, 1).
    rounds : int
        Number of rounds T >= 1.
    participation_probability, record_probability, records_per_client, \
noise_multiplier, analysis
        As in :func:`round_delta`.
    tolerance : float, optional
        Refine the grid until ``(upper - lower) / upper <= tolerance`` (or the
        size cap is hit).
    resolution : float, optional
        Or until ``upper - lower <= resolution`` (see
        :func:`dpfl.accounting.refine.refine_bound`; calibration sets it).

    Returns
    -------
    Bound
        ``lower <= epsilon <= upper``; ``upper`` is certified for the analysis.

    Raises
    ------
    InvalidParameterError
        If a parameter is out of range or the analysis is unknown.
    """
    p, q, d, analysis = _check_scheme(
        participation_probability, record_probability, records_per_client, analysis
    )
    delta = check_delta("delta", delta)
    rounds = check_count("rounds", rounds, minimum=1)
    sigma = check_positive("noise_multiplier", noise_multiplier)
    try:
        res = _refine.refine_bound(
            _builder(analysis, p, q, d, sigma),
            count=rounds,
            delta=delta,
            tolerance=tolerance,
            initial_discretization=start_step(rounds, tolerance),
            resolution=resolution,
        )
    except (
        _discretise.LossTailTooHeavy
    ):  # too little noise: no finite epsilon certified
        return Bound.trivial(for_delta=False)
    return res.bound


def delta(
    epsilon: float,
    *,
    rounds: int,
    participation_probability: float,
    record_probability: float,
    records_per_client: int,
    noise_multiplier: float,
    analysis: str = "sound",
    tolerance: float = 0.02,
) -> Bound:
    """Delta after ``rounds`` rounds at ``epsilon``, bracketed by two PLDs.

    Parameters
    ----------
    epsilon : float
        Target epsilon (>= 0).
    rounds : int
        Number of rounds T >= 1.
    participation_probability, record_probability, records_per_client, \
noise_multiplier, analysis
        As in :func:`round_delta`.
    tolerance : float, optional
        Target relative gap of the bracket.

    Returns
    -------
    Bound
        ``lower <= delta <= upper``.

    Raises
    ------
    InvalidParameterError
        If a parameter is out of range or the analysis is unknown.
    """
    p, q, d, analysis = _check_scheme(
        participation_probability, record_probability, records_per_client, analysis
    )
    eps = check_nonnegative("epsilon", epsilon)
    rounds = check_count("rounds", rounds, minimum=1)
    sigma = check_positive("noise_multiplier", noise_multiplier)
    try:
        res = _refine.refine_bound(
            _builder(analysis, p, q, d, sigma),
            count=rounds,
            epsilon=eps,
            tolerance=tolerance,
            initial_discretization=start_step(rounds, tolerance),
        )
    except _discretise.LossTailTooHeavy:  # too little noise: only delta <= 1 holds
        return Bound.trivial(for_delta=True)
    return res.bound


# --------------------------------------------------------------------------
# lower bound from a search over gradient configurations
# --------------------------------------------------------------------------

_GL_X, _GL_W = np.polynomial.legendre.leggauss(16)


def _hockey_2d(
    means: np.ndarray,
    weights_p: np.ndarray,
    weights_q: np.ndarray,
    eps: float,
    sigma: float,
    panels: int = 10,
) -> float:
    """``D_{e^eps}(P || Q)`` for 2-D Gaussian mixtures with covariance sigma^2 I.

    Exact in the first coordinate (all roots, :mod:`pld`), composite 16-point
    Gauss-Legendre in the second over ``[min - 12 sigma, max + 12 sigma]``.
    """
    u = means[:, 0]
    v = means[:, 1]
    order = np.argsort(u, kind="stable")
    u, v = u[order], v[order]
    a0, b0 = weights_p[order], weights_q[order]
    # merge equal first coordinates per quadrature node by keeping columns
    # separate is not allowed (distinct means required): group them.
    uniq, inv = np.unique(np.round(u, 12), return_inverse=True)
    lo, hi = v.min() - 12 * sigma, v.max() + 12 * sigma
    edges = np.linspace(lo, hi, panels + 1)
    mid = 0.5 * (edges[1:] + edges[:-1])
    half = 0.5 * (edges[1:] - edges[:-1])
    nodes = (mid[:, None] + half[:, None] * _GL_X[None, :]).ravel()
    wts = (half[:, None] * _GL_W[None, :]).ravel()
    dens = stats.norm.pdf(nodes[:, None], loc=v[None, :], scale=sigma)  # (n, K)
    a = np.zeros((nodes.size, uniq.size))
    b = np.zeros((nodes.size, uniq.size))
    for col in range(u.size):
        a[:, inv[col]] += a0[col] * dens[:, col]
        b[:, inv[col]] += b0[col] * dens[:, col]
    m = np.broadcast_to(uniq, a.shape)
    dl, _, _, _ = _hockey._hockey_rows(  # pylint: disable=protected-access
        m, a, b, a - b, np.full(nodes.size, eps), sigma
    )
    return float(np.dot(wts, dl))


def _configuration_delta(
    theta: float, radius: float, eps: float, p: float, q: float, d: int, sigma: float
) -> float:
    """Delta of the real mechanism for one configuration of gradients.

    Every companion has gradient ``radius * (cos theta, sin theta)``; the
    target record has ``(1, 0)``.
    """
    # companions' counts below 1e-17 relative weight change delta by less
    # than 1e-17 (this is a lower bound: dropping them is harmless)
    idx, w, _ = _binomial_weights(d, q, cut=1e-17)
    w = w / w.sum()
    g = radius * np.array([math.cos(theta), math.sin(theta)])
    base = idx[:, None] * g[None, :]
    means = np.concatenate([[[0.0, 0.0]], base, base + [1.0, 0.0]])
    wp = np.concatenate([[1 - p], p * (1 - q) * w, p * q * w])
    wq = np.concatenate([[1 - p], p * w, 0 * w])
    rem = _hockey_2d(means, wp, wq, eps, sigma)
    add = _hockey_2d(means, wq, wp, eps, sigma)
    return max(rem, add)


def configuration_search_lower_bound(
    *,
    participation_probability: float,
    record_probability: float,
    records_per_client: int,
    noise_multiplier: float,
    epsilon: float,
    angles: int = 13,
    radii: int = 5,
    refine: bool = True,
) -> float:
    """Per-round delta lower bound from the worst of a set of gradient configurations.

    Every companion record of the neighbouring client gets the same gradient
    ``r (cos t, sin t)`` (``0 <= r <= 1``, angle ``t`` to the target record's
    unit gradient); the real mechanism's output pair (no labels, nothing
    given to the adversary) is then a pair of 2-D Gaussian mixtures, whose
    hockey-stick divergence is integrated exactly along the target direction
    and by Gauss-Legendre quadrature across it. Any configuration is a valid
    instance, so the maximum over the grid (refined locally) is a lower bound
    on the true worst-case per-round delta. ``r = 0`` is CS; ``t = 0, r = 1``
    is the collinear pair of Theorem 4.1.

    Parameters
    ----------
    participation_probability, record_probability, records_per_client, \
noise_multiplier
        As in :func:`round_delta`.
    epsilon : float
        Per-round epsilon (>= 0).
    angles, radii : int, optional
        Grid sizes of the search over ``t in [0, pi]`` and ``r in (0, 1]``.
    refine : bool, optional
        Polish the best grid point with Nelder-Mead (slower, tighter).

    Returns
    -------
    float
        The largest delta found (a lower bound on the worst case).

    Raises
    ------
    InvalidParameterError
        If a parameter is out of range.
    """
    p, q, d, _ = _check_scheme(
        participation_probability, record_probability, records_per_client, "sound"
    )
    sigma = check_positive("noise_multiplier", noise_multiplier)
    eps = check_nonnegative("epsilon", epsilon)
    check_count("angles", angles, minimum=2)
    check_count("radii", radii, minimum=1)
    best = _round_delta(eps, "cs", p, q, d, sigma)  # r = 0
    best_t, best_r = 0.0, 0.0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for t in np.linspace(0.0, math.pi, angles):
            for r in np.linspace(1.0 / radii, 1.0, radii):
                val = _configuration_delta(float(t), float(r), eps, p, q, d, sigma)
                if val > best:
                    best, best_t, best_r = val, float(t), float(r)
        if refine and best_r > 0:
            res = optimize.minimize(
                lambda x: (
                    -_configuration_delta(
                        float(np.clip(x[0], 0, math.pi)),
                        float(np.clip(x[1], 1e-6, 1.0)),
                        eps,
                        p,
                        q,
                        d,
                        sigma,
                    )
                ),
                x0=[best_t, best_r],
                method="Nelder-Mead",
                options={"xatol": 1e-4, "fatol": 1e-3 * best, "maxiter": 200},
            )
            best = max(best, -float(res.fun))
    return float(best)


# -- the price of a ClientPoisson round (registered with the Accountant) -------
@pricing.canonical.register
def _(event: ev.ClientPoisson) -> ev.Event:
    # Client-level Poisson sampling of a Gaussian prices as PoissonSampled.
    if isinstance(event.event, ev.Gaussian):
        return pricing.canonical(
            ev.PoissonSampled(event.sampling_probability, event.event)
        )
    return event


@pricing.prices(ev.ClientPoisson)
def _price_client_poisson(
    event: ev.ClientPoisson, *, analysis: str, discretization: float
) -> pricing.PldPair:
    inner = event.event
    if isinstance(inner, ev.RecordPoisson):
        # Random participation: one of the paper's analyses.
        sigma = pricing.unit_gaussian(inner.event)
        if sigma is None:
            raise UnsupportedEventError(
                "random participation is priced over a Gaussian event; "
                f"got {inner.event!r}"
            )
        kw: dict[str, Any] = {
            "participation_probability": event.sampling_probability,
            "record_probability": inner.sampling_probability,
            "records_per_client": inner.records_per_client,
            "noise_multiplier": sigma,
            "analysis": analysis,
            "value_discretization": discretization,
        }
        return (
            participation_pld(pessimistic=True, **kw),
            participation_pld(pessimistic=False, **kw),
        )
    # Client-level Poisson sampling of a Gaussian sum (add/remove one client).
    return pricing.poisson_of_gaussian(
        event.sampling_probability, inner, discretization
    )
