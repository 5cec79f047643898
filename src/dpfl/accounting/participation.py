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

import math
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
from dp_accounting.pld.privacy_loss_distribution import PrivacyLossDistribution
from scipy import optimize, special

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
from dpfl.accounting.rp_labels import _binomial_weights, _labels, _round_curves
from dpfl.errors import InvalidParameterError, UnsupportedEventError

__all__ = [
    "ANALYSES",
    "PAPER_WARNING",
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
    1e4 (never coarser than the generic rule). Brackets are second order in
    the step, so a looser tolerance than the Accountant's 0.5% starts
    coarser by the square root of the ratio, or by the rounds' factor where
    that is larger (their product left the lower PLD uninformative for two
    grids at 1e5 rounds): a run's ledger (2%) on a step of
    2e-5, which halves its epsilon query at an evaluation (p = 0.001, q =
    0.1, d = 30, sigma 2.5, delta 1e-5: 1.9 s to 0.9 s at 1e3 rounds, 0.95
    to 0.47 s at 1e4, one machine under load; gaps 6.3e-3 and 1.7e-2). At
    1e5 rounds the rounds' factor, 3.2e-5, is the larger.
    """
    looser = math.sqrt(max(tolerance / 0.005, 1.0))
    return float(
        min(
            _refine.start_discretization(tolerance),
            _DEFAULT_H * max(looser, math.sqrt(rounds / 1e4)),
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
