"""Calibration: the noise, rounds or sampling rate for a target (ε, δ).

One monotone root-finder, :func:`solve_noise_multiplier`, finds its own
bracket and serves every scheme: :func:`calibrate_noise_multiplier` applies it
to an event family priced by the :class:`~dpfl.accounting.accountant.Accountant`
(what ``dpfl train`` and ``dpfl calibrate`` use), and scheme modules pass it a
faster closed form where they have one (e.g. one round of random
participation, or an RDP curve). Calibration always uses the certified *upper*
bound, so the returned parameter meets the target.

What a run's guard checks. For schemes whose runs charge each unit only for
the rounds it took part in (check-in, two-stage sampling; see
:mod:`dpfl.accounting.schemes`), the ledger's guard composes the realised
rounds of the unit that took part most often and stops the run before it
would pass the budget. :func:`calibrate_noise_multiplier` with ``population``
plans for that: it calibrates for the number of rounds that the most active
of ``population`` units takes part in with probability ``completion``
(exact binomial law), so that a calibrated run completes all its rounds with
at least that probability (and otherwise stops at the budget, still within
it). Without ``population`` it calibrates the guarantee of ``rounds`` rounds
as :meth:`Accountant.compose` prices them (for per-participant schemes: each
round with its visible sampling), which is what ``dpfl account`` reports.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from scipy import stats

from dpfl._validate import (
    check_count,
    check_delta,
    check_positive,
    check_probability,
)
from dpfl.accounting import costs, schemes
from dpfl.accounting.accountant import Accountant, composed_epsilon
from dpfl.accounting.events import Event
from dpfl.errors import DpflError

__all__ = [
    "CertifiesEverySigma",
    "calibrate_noise_multiplier",
    "calibrate_rounds",
    "calibrate_sampling_rate",
    "planned_charges",
    "solve_noise_multiplier",
]

#: Range searched for a noise multiplier.
SMALLEST, LARGEST = 1e-3, 1e5


class CertifiesEverySigma(DpflError):
    """The analysis certifies the target for every noise multiplier tried.

    A valid analysis never does (little noise leaks much); this happens for
    analyses that are not valid bounds, e.g. Theorem 4.1 of random
    participation in the paper's second scenario.
    """


def _safe(epsilon_of: Callable[[float], float], sigma: float) -> float:
    """``epsilon_of(sigma)``, with numerical overflow read as "no guarantee"."""
    try:
        value = float(epsilon_of(sigma))
    except (OverflowError, FloatingPointError, ZeroDivisionError):
        return math.inf
    return math.inf if math.isnan(value) else value


def solve_noise_multiplier(
    epsilon_of: Callable[[float], float],
    *,
    epsilon: float,
    tolerance: float = 1e-3,
    what: str = "the target",
) -> float:
    """Smallest noise multiplier σ with ``epsilon_of(σ) <= epsilon``.

    ``epsilon_of`` must be non-increasing in σ (more noise, more privacy).
    Each evaluation is a composed PLD (seconds), so the search spends as few
    as it can. It starts at σ = 1 and steps outwards in log σ until the
    target is bracketed within [:data:`SMALLEST`, :data:`LARGEST`]: first
    the step that ε ∝ σ⁻² predicts, then the step that the last two points
    extrapolate to in ``log ε`` against ``log σ`` (nearly straight for every
    scheme: ε falls like a power of σ), overshot by a fifth and kept within
    a factor 1.25 to 16, so a flat ``epsilon_of`` reaches the ends of the
    range in a few steps. :func:`_narrow` then closes the bracket; the upper
    end of the final bracket is returned, so the target is met.

    Parameters
    ----------
    epsilon_of : callable
        σ -> a certified upper bound on ε at the target δ.
    epsilon : float
        Target ε (> 0).
    tolerance : float
        Relative width of the final bracket.
    what : str
        Describes the target in error messages (e.g. "(epsilon=1, delta=1e-5)
        over 100 rounds under 'wcs'").

    Returns
    -------
    float
        σ meeting the target.

    Raises
    ------
    DpflError
        If even σ = :data:`LARGEST` misses the target (the message gives the
        smallest ε that σ reaches, i.e. what the target would need).
    CertifiesEverySigma
        If even σ = :data:`SMALLEST` meets it (the analysis is not a valid
        bound for this target).
    """
    target = check_positive("epsilon", epsilon)
    tol = check_positive("tolerance", tolerance)
    value = _safe(epsilon_of, 1.0)
    up = value > target  # more noise needed: search upwards
    edge = math.log(LARGEST if up else SMALLEST)
    x, g = 0.0, _log_gap(value, target)
    prev: tuple[float, float] | None = None
    while (g > 0.0) == up:  # not yet bracketed
        if x == edge:
            if up:
                raise DpflError(
                    f"no noise multiplier up to {LARGEST:g} meets {what}: at "
                    f"noise_multiplier={LARGEST:g} epsilon is still "
                    f"{value:.4g} > {target:g}; a larger epsilon "
                    f"(>= {value:.4g}), a larger delta or fewer "
                    "rounds is needed"
                )
            raise CertifiesEverySigma(
                f"the analysis certifies {what} for every noise multiplier "
                f"down to {SMALLEST:g}, so it cannot calibrate the noise (a "
                "valid bound never does this; the analysis is not one)"
            )
        step = _outward_step(prev, (x, g))
        nxt = min(x + step, edge) if up else max(x - step, edge)
        prev, x = (x, g), nxt
        value = _safe(epsilon_of, math.exp(x))
        g = _log_gap(value, target)
    # prev is on the other side of the target than (x, g)
    assert prev is not None
    low, high = (prev, (x, g)) if up else ((x, g), prev)
    return _narrow(epsilon_of, target, low, high, math.log1p(tol))


def _log_gap(value: float, target: float) -> float:
    """``log ε - log target``, positive exactly when ``ε > target``.

    -inf at ε = 0, +inf at an infinite ε. The side is decided on ε itself:
    where rounding puts the logarithm on the other side of 0, the smallest
    gap of the right sign stands in, so the returned σ meets the target.
    """
    if value <= 0.0:
        return -math.inf
    gap = math.log(value) - math.log(target)
    if value > target:
        return max(gap, math.ulp(0.0))
    return min(gap, 0.0)


#: The smallest and largest outward step of the bracketing search (log σ).
_MIN_STEP, _MAX_STEP = math.log(1.25), math.log(16.0)


def _outward_step(prev: tuple[float, float] | None, cur: tuple[float, float]) -> float:
    """The next outward step in log σ: extrapolated past the root, bounded.

    The first step assumes ε ∝ σ⁻² (a Gaussian's ε at moderate to large ε;
    small ε fall as σ⁻¹, where it undershoots and the next step corrects).
    """
    if prev is None:
        g = cur[1]
        wanted = 0.6 * abs(g) if math.isfinite(g) else _MAX_STEP
        return min(max(wanted, _MIN_STEP), _MAX_STEP)
    (x0, g0), (x1, g1) = prev, cur
    if not (math.isfinite(g0) and math.isfinite(g1)) or g0 == g1:
        return _MAX_STEP  # flat or unbounded: leave quickly
    slope = (g1 - g0) / (x1 - x0)
    wanted = abs(g1 / slope) * 1.2  # overshoot a little, to bracket at once
    return min(max(wanted, _MIN_STEP), _MAX_STEP)


def _narrow(
    epsilon_of: Callable[[float], float],
    target: float,
    low: tuple[float, float],
    high: tuple[float, float],
    width: float,
) -> float:
    """Close ``[a, b]`` in log σ (``g(a) > 0 >= g(b)``) to ``width``; return σ at b.

    ``low`` and ``high`` are ``(log σ, log ε - log target)`` at the ends.

    Each step estimates the root by inverse quadratic interpolation through
    the two ends and the end they replaced (a secant where that fails, a
    bisection where the values are not finite), then evaluates 0.45 of the
    width past the estimate on the side of the end farther from it: when
    the estimate is good, that point lands on its expected side and the next
    one, 0.45 of the width on the other, closes the bracket (two evaluations
    once the estimate is within the tolerance; bisection took 10 and
    regula falsi 5-9, measured on random participation). After three steps
    in a row that moved the same end the next one bisects, so a biased
    estimate cannot make the search crawl. The invariant is kept and ``b``
    returned.
    """
    (a, ga), (b, gb) = low, high
    old: tuple[float, float] | None = None  # the end replaced last
    moves = ""  # which end each step moved: "a" or "b"
    half = 0.45 * width
    while b - a > width:
        estimate = _root_estimate((a, ga), (b, gb), old)
        crawling = len(moves) >= 3 and len(set(moves[-3:])) == 1
        if estimate is None or crawling:
            x = 0.5 * (a + b)
        else:
            x = estimate + half if b - estimate >= estimate - a else estimate - half
        margin = min(half, 0.25 * (b - a))
        x = min(max(x, a + margin), b - margin)
        g = _log_gap(_safe(epsilon_of, math.exp(x)), target)
        if g <= 0.0:  # the side is decided on ε itself
            old, (b, gb), moves = (b, gb), (x, g), moves + "b"
        else:
            old, (a, ga), moves = (a, ga), (x, g), moves + "a"
        if crawling or estimate is None:
            moves = ""  # a bisection starts the count anew
    return float(math.exp(b))


def _root_estimate(
    low: tuple[float, float],
    high: tuple[float, float],
    old: tuple[float, float] | None,
) -> float | None:
    """Where ``g`` crosses 0 in ``(a, b)``, interpolated in x against g."""
    (a, ga), (b, gb) = low, high
    if not (math.isfinite(ga) and math.isfinite(gb)) or ga <= gb:
        return None
    secant = a + (b - a) * ga / (ga - gb)
    if old is not None and math.isfinite(old[1]):
        (c, gc) = old
        if len({ga, gb, gc}) == 3:  # inverse quadratic interpolation
            x = (
                a * gb * gc / ((ga - gb) * (ga - gc))
                + b * ga * gc / ((gb - ga) * (gb - gc))
                + c * ga * gb / ((gc - ga) * (gc - gb))
            )
            if a < x < b:
                return x
    return secant


def planned_charges(
    event: Event,
    *,
    rounds: int,
    analysis: str | None = None,
    population: int | None = None,
    completion: float = 0.95,
) -> list[tuple[Event, int]]:
    """What a guard charges the most exposed unit over ``rounds`` rounds.

    Parameters
    ----------
    event : Event
        One round.
    rounds : int
        Number of rounds.
    analysis : str or None
        The analysis (``None``: the scheme's default).
    population : int or None
        Number of units that may take part. ``None``: price ``rounds`` rounds
        of ``event`` as the Accountant does (every round, with its sampling).
    completion : float
        With ``population``: the probability that no unit takes part more
        often than planned.

    Returns
    -------
    list of (Event, int)
        Events and counts to compose.
    """
    rounds = check_count("rounds", rounds, minimum=1)
    if population is None or not schemes.per_participant(event, analysis):
        return [(event, rounds)]
    population = check_count("population", population, minimum=1)
    completion = check_probability("completion", completion, allow_one=False)
    cost, prob = next(iter(costs.participant_costs(event).values()))
    # Smallest n with P(max over units of Binomial(rounds, prob) <= n) >= completion.
    per_unit = completion ** (1.0 / population)
    n = int(stats.binom.ppf(per_unit, rounds, prob))
    return [(cost, max(1, min(n, rounds)))]


def calibrate_noise_multiplier(
    make_event: Callable[[float], Event],
    *,
    epsilon: float,
    delta: float,
    rounds: int = 1,
    analysis: str | None = None,
    population: int | None = None,
    completion: float = 0.95,
    tolerance: float = 1e-3,
    bound_tolerance: float = 0.005,
) -> float:
    """Smallest noise multiplier whose ``rounds`` rounds meet (ε, δ).

    Parameters
    ----------
    make_event : callable
        Maps a noise multiplier to the round's event (no model is needed:
        algorithms expose this as a pure function of their parameters).
    epsilon, delta : float
        The target.
    rounds : int
        Number of identical rounds.
    analysis : str or None
        Analysis passed to the accountant (``None``: each scheme's default).
    population : int or None
        Plan for a run's guard over this many units (see the module
        docstring); ``None`` calibrates the unconditional guarantee.
    completion : float
        Probability that a calibrated run completes (with ``population``).
    tolerance : float
        Relative precision of the returned value (it is rounded up).
    bound_tolerance : float
        The accountant's bracket width; use the ledger's to calibrate exactly
        what its budget guard checks.

    Returns
    -------
    float
        The calibrated noise multiplier (meets the target by the upper bound).

    Raises
    ------
    DpflError
        If no noise multiplier meets the target (the message says what would).
    CertifiesEverySigma
        If the analysis certifies the target for every noise multiplier.
    """
    epsilon = check_positive("epsilon", epsilon)
    delta = check_delta("delta", delta)
    rounds = check_count("rounds", rounds, minimum=1)
    plan = planned_charges(
        make_event(1.0),
        rounds=rounds,
        analysis=analysis,
        population=population,
        completion=completion,
    )

    def epsilon_of(sigma: float) -> float:
        # only "is epsilon below the target?" matters: resolve it to a
        # fraction of the target, not of epsilon (tiny ones cost minutes),
        # and no further than the side of the target it falls on
        charges = planned_charges(
            make_event(sigma),
            rounds=rounds,
            analysis=analysis,
            population=population,
            completion=completion,
        )
        return composed_epsilon(
            tuple((e, n) for e, n in charges),
            delta,
            analysis=analysis,
            tolerance=bound_tolerance,
            resolution=bound_tolerance * epsilon,
            threshold=epsilon,
        ).upper

    counted = (
        f"{rounds} rounds"
        if plan[0][1] == rounds or population is None
        else f"the {plan[0][1]} of {rounds} rounds the most active of {population} "
        f"units takes part in (w.p. {completion:g})"
    )
    return solve_noise_multiplier(
        epsilon_of,
        epsilon=epsilon,
        tolerance=tolerance,
        what=f"(epsilon={epsilon:g}, delta={delta:g}) over {counted} under the "
        f"{analysis or 'default'} analysis",
    )


def calibrate_rounds(
    event: Event,
    *,
    epsilon: float,
    delta: float,
    analysis: str | None = None,
    limit: int = 1_000_000,
) -> int:
    """Largest number of rounds of ``event`` within (ε, δ) (0 if none fits)."""
    check_positive("epsilon", epsilon)
    check_delta("delta", delta)

    def ok(t: int) -> bool:
        acc = Accountant(analysis).compose(event, t)
        return acc.epsilon(delta).upper <= epsilon

    if not ok(1):
        return 0
    lo, hi = 1, 2
    while hi <= limit and ok(hi):
        lo, hi = hi, 2 * hi
    hi = min(hi, limit + 1)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    return lo


def calibrate_sampling_rate(
    make_event: Callable[[float], Event],
    *,
    epsilon: float,
    delta: float,
    rounds: int = 1,
    analysis: str | None = None,
    tolerance: float = 1e-3,
) -> float:
    """Largest sampling rate in (0, 1] whose composition meets (ε, δ)."""
    check_positive("epsilon", epsilon)
    check_delta("delta", delta)
    rounds = check_count("rounds", rounds, minimum=1)

    def ok(rate: float) -> bool:
        acc = Accountant(analysis).compose(make_event(rate), rounds)
        return acc.epsilon(delta).upper <= epsilon

    if ok(1.0):
        return 1.0
    lo, hi = 1e-9, 1.0
    if not ok(lo):
        raise DpflError(f"no sampling rate meets epsilon={epsilon}, delta={delta}")
    while hi / lo > 1 + tolerance:
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    return lo
