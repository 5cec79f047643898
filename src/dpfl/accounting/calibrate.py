"""Generic calibration: noise, rounds or sampling rate for a target (ε, δ).

One monotone root-finder over any event family priced by the
:class:`~dpfl.accounting.accountant.Accountant`; calibration always uses the
certified *upper* bound, so the returned parameter meets the target.
Scheme modules with closed forms (e.g. :mod:`dpfl.accounting.participation`)
offer faster calibrators of their own; these are the fallback for any event.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from dpfl.accounting._checks import check_count, check_delta, check_positive
from dpfl.accounting.accountant import Accountant
from dpfl.accounting.events import Event
from dpfl.errors import DpflError

__all__ = ["calibrate_noise_multiplier", "calibrate_rounds", "calibrate_sampling_rate"]


def _epsilon(
    event: Event, rounds: int, delta: float, analysis: str, bracket: float = 0.005
) -> float:
    acc = Accountant(analysis, tolerance=bracket).compose(event, rounds)
    return acc.epsilon(delta).upper


def calibrate_noise_multiplier(
    make_event: Callable[[float], Event],
    *,
    epsilon: float,
    delta: float,
    rounds: int = 1,
    analysis: str = "sound",
    bracket: tuple[float, float] = (0.05, 200.0),
    tolerance: float = 1e-3,
    bound_tolerance: float = 0.005,
) -> float:
    """Smallest noise multiplier whose ``rounds``-fold composition meets (ε, δ).

    Parameters
    ----------
    make_event : callable
        Maps a noise multiplier to the round's event.
    epsilon, delta : float
        The target.
    rounds : int
        Number of identical rounds.
    analysis : str
        Analysis passed to the accountant.
    bracket : (float, float)
        Search interval for the noise multiplier.
    tolerance : float
        Relative precision of the returned value (it is rounded up).
    bound_tolerance : float
        The accountant's bracket width; use the ledger's to calibrate exactly
        what its budget guard will check.

    Returns
    -------
    float
        The calibrated noise multiplier (meets the target by the upper bound).

    Raises
    ------
    DpflError
        If even the largest noise in ``bracket`` misses the target.
    """
    check_positive("epsilon", epsilon)
    check_delta("delta", delta)
    rounds = check_count("rounds", rounds, minimum=1)
    lo, hi = bracket

    def ok(sigma: float) -> bool:
        eps = _epsilon(make_event(sigma), rounds, delta, analysis, bound_tolerance)
        return eps <= epsilon

    if not ok(hi):
        raise DpflError(
            f"no noise multiplier up to {hi} meets epsilon={epsilon}, delta={delta} "
            f"over {rounds} rounds"
        )
    if ok(lo):
        return lo
    while hi / lo > 1 + tolerance:
        mid = math.sqrt(lo * hi)
        lo, hi = (lo, mid) if ok(mid) else (mid, hi)
    return hi


def calibrate_rounds(
    event: Event,
    *,
    epsilon: float,
    delta: float,
    analysis: str = "sound",
    limit: int = 1_000_000,
) -> int:
    """Largest number of rounds of ``event`` within (ε, δ) (0 if none fits)."""
    check_positive("epsilon", epsilon)
    check_delta("delta", delta)

    def ok(t: int) -> bool:
        return _epsilon(event, t, delta, analysis) <= epsilon

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
    analysis: str = "sound",
    tolerance: float = 1e-3,
) -> float:
    """Largest sampling rate in (0, 1] whose composition meets (ε, δ)."""
    check_positive("epsilon", epsilon)
    check_delta("delta", delta)
    rounds = check_count("rounds", rounds, minimum=1)

    def ok(rate: float) -> bool:
        return _epsilon(make_event(rate), rounds, delta, analysis) <= epsilon

    if ok(1.0):
        return 1.0
    lo, hi = 1e-9, 1.0
    if not ok(lo):
        raise DpflError(f"no sampling rate meets epsilon={epsilon}, delta={delta}")
    while hi / lo > 1 + tolerance:
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    return lo
