"""The :class:`Accountant`: composes heterogeneous events and answers bounds.

``Accountant().compose(e1).compose(e2, count=100).epsilon(1e-5)`` returns a
:class:`~dpfl.accounting.bounds.Bound`: ``upper`` is certified (pessimistic
privacy-loss distributions, connect-the-dots), ``lower`` comes from an
optimistic discretisation of the *same* analysis. The value discretisation is
refined until the two agree within ``tolerance`` (relative) or the size cap is
reached; the achieved gap is visible in the returned bound.

Events are priced by :func:`dpfl.accounting.pricing.price`, a registry that
each formula module fills, next to its formula, with how an event class turns
into an (upper, lower) pair of dp_accounting privacy-loss distributions for a
given analysis (:func:`dpfl.accounting.pricing.prices`).
:meth:`Accountant.supports` says whether an event can be priced.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import numpy as np

from dpfl._validate import (
    check_count,
    check_delta,
    check_nonnegative,
    check_positive,
)
from dpfl.accounting import costs, discretise, gaussian, mixture, pld, refine, schemes
from dpfl.accounting import events as ev
from dpfl.accounting._quiet import quiet as _quiet
from dpfl.accounting.bounds import Bound
from dpfl.accounting.pricing import (
    PLD,
    PldPair,
    canonical,
    exclusive,
    price,
    supports,
    unit_gaussian,
)
from dpfl.errors import InvalidParameterError

__all__ = ["Accountant", "composed_epsilon"]


class Accountant:
    """Compose events and report (ε, δ) as bounds.

    Parameters
    ----------
    analysis : str or None
        The analysis used for schemes that offer several; ``None`` (default)
        prices each event with its scheme's default, the tightest proven
        analysis (see :mod:`dpfl.accounting.schemes`).
    tolerance : float
        Target relative gap between the upper and lower bound (0.5% by
        default, so the certified upper bound is within 0.5% of the truth).
    discretization : float or None
        Starting value discretisation; ``None`` picks one from the events.
    max_support : int
        Refinement stops before a composed PLD would exceed this many grid
        points (memory and time cap; about 32 MB per direction).
    resolution : float
        An ε bracket at most this wide (absolute) is accurate enough whatever
        its relative width (default 0: the tolerance alone decides).
        Calibration sets it to a small fraction of its target ε, since it
        only asks whether ε is below the target.
    threshold : float or None
        An ε bracket wholly on one side of this value (upper end at or below
        it, or lower end above it) is accurate enough: a calibration sets it
        to its target ε and stops refining a noise level once the side is
        known (a finer grid only narrows the bracket inside the first).

    Examples
    --------
    >>> from dpfl.accounting.events import Gaussian
    >>> acc = Accountant().compose(Gaussian(1.0), count=4)
    >>> round(acc.epsilon(1e-5).upper, 2)
    10.0
    """

    def __init__(
        self,
        analysis: str | None = None,
        *,
        tolerance: float = 0.005,
        discretization: float | None = None,
        max_support: int = 4_000_000,
        resolution: float = 0.0,
        threshold: float | None = None,
    ) -> None:
        self.analysis = schemes.check_analysis_name(analysis)
        self.tolerance = tolerance
        self.discretization = discretization
        self.max_support = max_support
        self.resolution = check_nonnegative("resolution", resolution)
        self.threshold = (
            None if threshold is None else check_positive("threshold", threshold)
        )
        self._events: list[tuple[ev.Event, int]] = []

    # -- building -------------------------------------------------------------
    def compose(self, event: ev.Event, count: int = 1) -> Accountant:
        """Add ``count`` repetitions of ``event``; returns ``self``."""
        if not isinstance(event, ev.Event):
            raise InvalidParameterError(f"event must be a dpfl event; got {event!r}")
        count = check_count("count", count, minimum=0)
        if count == 0:
            return self
        if self._events and self._events[-1][0] == event:
            last, n = self._events[-1]
            self._events[-1] = (last, n + count)
        else:
            self._events.append((event, count))
        return self

    @property
    def events(self) -> list[tuple[ev.Event, int]]:
        """The composed (event, count) pairs, merged where consecutive and equal."""
        return list(self._events)

    # -- queries --------------------------------------------------------------
    def _counts(self) -> dict[ev.Event, int]:
        """Each distinct canonical event and how often it is composed.

        Self-compositions are unrolled (``SelfComposed(e, k)`` ``n`` times is
        ``e`` ``k n`` times), so that every composition of a query is one
        certified FFT tilted for that query.
        """
        counts: dict[ev.Event, int] = {}
        for e, n in self._events:
            key, n = _unrolled(e, n)
            counts[key] = counts.get(key, 0) + n
        return counts

    def _parts(self, h: float) -> list[pld.Part]:
        """Every distinct event's one-round PLDs at step ``h``, with its count.

        Check-in and two-stage rounds become :class:`pld.MixturePart` (each
        label's one-step PLDs and its number of steps), so that a round of
        ``K`` local steps is never composed on its own before the rounds are.
        """
        parts: list[pld.Part] = []
        for e, n in self._counts().items():
            mix = _mixture_part(e, self.analysis, h, n)
            if mix is not None:
                parts.append(mix)
            else:
                up, lo = _cached_price(e, schemes.resolve_analysis(e, self.analysis), h)
                parts.append((up, lo, n))
        plds = [q for part in parts for q in _held(part)]
        # pylint: disable-next=protected-access
        if len({q._pmf_remove._discretization for q in plds}) > 1:
            # one-round PLDs may come on coarser grids: move them to one grid
            ups = iter(pld.common_step([q for part in parts for q in _held(part, 0)]))
            lows = iter(pld.common_step([q for part in parts for q in _held(part, 1)]))
            parts = [_regridded(part, ups, lows) for part in parts]
        return parts

    def _bracket(
        self, *, delta: float | None = None, epsilon: float | None = None
    ) -> Bound:
        """The bracket and the path that answered it (``Bound.method``).

        ``"gaussian-exact"``: plain Gaussians (also Poisson sampling with
        probability 1), exactly mu-GDP in closed form. ``"gdp-mixture"``:
        public-label mixtures of Gaussians (check-in, two-stage) and plain
        Gaussians, whose composition is a mixture of mu-GDP curves over the
        participation counts, summed exactly (:mod:`dpfl.accounting.mixture`).
        ``"pld"``: the refined, certified PLD bracket. ``"pld-coarse"``: a
        composition needed a coarser grid than the refinement asked for, to
        stay within the memory cap (still certified, wider). ``"rdp-fallback"``:
        for Poisson-subsampled Gaussians whose PLD bracket did not reach the
        tolerance, a smaller certified upper value from Renyi DP or from the
        unsampled Gaussian's closed form (:func:`_fallback_upper`); the lower
        value is still the PLD's. ``"rdp-fallback-no-lower"``: the PLD ran out
        of memory (the cap should prevent it); that upper value and the
        trivial 0 below.
        """
        if not self._events:
            return Bound.exact(0.0, "exact")
        mu = _gaussian_mu(self._events)
        if mu is not None:
            if delta is not None:
                return _gaussian_epsilon_bound(delta, mu)
            return _gaussian_delta_bound(float(epsilon), mu)  # type: ignore[arg-type]
        exact = _mixture_bound(self._events, self.analysis, delta, epsilon)
        if exact is not None:
            return exact
        try:
            result = refine.refine_parts(
                self._parts,
                delta=delta,
                epsilon=epsilon,
                tolerance=self.tolerance,
                initial_discretization=(
                    self.discretization
                    or _default_discretization(
                        self._events,
                        self.tolerance,
                        self.analysis,
                        own_scale=self.resolution == 0,
                    )
                ),
                max_grid_points=self.max_support,
                resolution=self.resolution,
                threshold=self.threshold,
            )
        except (MemoryError, discretise.LossTailTooHeavy) as exc:
            # Last resort (the composition cap should prevent a MemoryError; a
            # too-heavy tail is too little noise): a closed upper value, and
            # only the trivial 0 below, said so by the name.
            rdp_up = _fallback_upper(self._events, delta=delta, epsilon=epsilon)
            if rdp_up is not None:
                return Bound(0.0, 0.5 * rdp_up, rdp_up, "rdp-fallback-no-lower")
            if isinstance(exc, MemoryError):
                raise
            return Bound.trivial(for_delta=delta is None)
        b = result.bound
        method = "pld-coarse" if result.coarse else "pld"
        if not result.converged:
            rdp_up = _fallback_upper(self._events, delta=delta, epsilon=epsilon)
            # Only the upper value is replaced; the PLD's lower value is a
            # valid lower bound and stays (a fallback below it cannot be
            # right, so it is not taken).
            if rdp_up is not None and b.lower <= rdp_up < b.upper:
                return Bound(b.lower, 0.5 * (b.lower + rdp_up), rdp_up, "rdp-fallback")
        return dataclasses.replace(b, method=method)

    @staticmethod
    def supports(event: ev.Event) -> bool:
        """Whether ``event`` can be priced (some module registered its price).

        A composed event (e.g. :class:`~dpfl.accounting.events.SelfComposed`)
        is supported if its class is; its inner events are checked when it is
        priced.
        """
        return supports(event)

    def describe(self) -> list[dict[str, Any]]:
        """The terms, analysis and status of each distinct composed event.

        Returns
        -------
        list of dict
            :func:`dpfl.accounting.schemes.describe` of each distinct event.
        """
        seen: dict[ev.Event, dict[str, Any]] = {}
        for e, _ in self._events:
            seen.setdefault(canonical(e), schemes.describe(e, self.analysis))
        return list(seen.values())

    def epsilon(self, delta: float) -> Bound:
        """Smallest ε with the composition (ε, δ)-DP, as a bound."""
        return self._bracket(delta=check_delta("delta", delta))

    def delta(self, epsilon: float) -> Bound:
        """δ(ε) of the composition, as a bound."""
        return self._bracket(epsilon=check_nonnegative("epsilon", epsilon))


@functools.lru_cache(maxsize=1024)
def composed_epsilon(
    events: tuple[tuple[ev.Event, int], ...],
    delta: float,
    *,
    analysis: str | None = None,
    tolerance: float = 0.005,
    resolution: float = 0.0,
    threshold: float | None = None,
) -> Bound:
    """``Accountant(...).compose(e, n) ... .epsilon(delta)``, memoised per process.

    A run's ledger, its guard and its calibration ask the same questions
    again and again: seeds of one configuration, the variants of a sweep that
    share a noise level, a guarantee recomputed after each run. The answer is
    a pure function of the composed events and the settings, so it is kept
    (the last 1024 distinct questions) and shared by every caller in the
    process.

    Parameters
    ----------
    events : tuple of (Event, int)
        The composition, as (event, count) pairs (hashable; order does not
        change the answer, but a reordered tuple is a different key).
    delta : float
        Target δ in (0, 1).
    analysis, tolerance, resolution, threshold
        As for :class:`Accountant`.

    Returns
    -------
    Bound
        The composition's ε at ``delta``.
    """
    acc = Accountant(
        analysis, tolerance=tolerance, resolution=resolution, threshold=threshold
    )
    for event, count in events:
        acc.compose(event, count)
    return acc.epsilon(delta)


def _mixture_part(
    event: ev.Event, analysis: str | None, h: float, count: int
) -> pld.MixturePart | None:
    """A check-in or two-stage event as a :class:`pld.MixturePart` (else None).

    Each role (exclusive, as :func:`_exclusive` makes them) releases its cost:
    ``SelfComposed(e, K)`` is ``K`` steps of ``e``, priced once. Check-in
    under the paper's analysis is priced as Poisson sampling instead.
    """
    if isinstance(event, ev.CheckIn):
        if schemes.resolve_analysis(event, analysis) == "paper":
            return None
    elif not isinstance(event, ev.TwoStage):
        return None
    weights, ups, lows, powers = [], [], [], []
    for weight, cost in exclusive(costs.participant_costs(event)):
        if weight <= 0:
            continue
        inner, steps = _unrolled(cost, 1)
        up, lo = _cached_price(inner, "exact", h)
        weights.append(weight)
        ups.append(up)
        lows.append(lo)
        powers.append(steps)
    if not weights:
        return None
    return pld.MixturePart(
        tuple(weights), tuple(ups), tuple(lows), tuple(powers), count
    )


def _held(part: pld.Part, side: int | None = None) -> list[PLD]:
    """The PLDs of a part: both sides, or only the upper (0) or lower (1)."""
    if isinstance(part, pld.MixturePart):
        sides = [part.uppers, part.lowers]
        return [q for i, qs in enumerate(sides) if side in (None, i) for q in qs]
    return [q for i, q in enumerate(part[:2]) if side in (None, i)]


def _regridded(part: pld.Part, ups: Any, lows: Any) -> pld.Part:
    """``part`` with its PLDs taken, in order, from the regridded iterators."""
    if isinstance(part, pld.MixturePart):
        k = len(part.weights)
        return dataclasses.replace(
            part,
            uppers=tuple(next(ups) for _ in range(k)),
            lowers=tuple(next(lows) for _ in range(k)),
        )
    return (next(ups), next(lows), part[2])


@functools.lru_cache(maxsize=64)
def _cached_price(event: ev.Event, analysis: str, h: float) -> PldPair:
    return price(event, analysis=analysis, discretization=h)


def _default_discretization(
    items: list[tuple[ev.Event, int]],
    tolerance: float,
    analysis: str | None = None,
    *,
    own_scale: bool = False,
) -> float:
    """A starting grid: the finest any of the events asks for.

    ``own_scale``: start where :func:`dpfl.accounting.refine.refine_parts`
    would move after its first bracket when that grid is coarse against one
    round's losses (it does unless the first bracket is already resolved,
    which only a ``resolution`` allows).
    """
    return float(
        min(_start_grid(e, n, tolerance, analysis, own_scale) for e, n in items)
    )


#: Relative bracket widths from which the symmetrised subsampling PLDs start
#: on a coarser grid (:func:`_start_grid`), and the grids.
_SYMMETRISED_STEPS = ((2e-2, 4e-2), (5e-3, 1e-2), (0.0, 1e-3))


def _start_grid(
    event: ev.Event,
    count: int,
    tolerance: float,
    analysis: str | None = None,
    own_scale: bool = False,
) -> float:
    """A grid whose bracket is about ``tolerance`` wide; refinement goes finer.

    :func:`dpfl.accounting.refine.start_discretization`, except for random
    participation and the symmetrised subsampling-without-replacement PLDs.
    """
    inner = event.event if isinstance(event, ev.SelfComposed) else event
    if isinstance(inner, ev.ClientPoisson) and isinstance(
        inner.event, ev.RecordPoisson
    ):
        # random participation: small per-round losses need a fine grid
        from dpfl.accounting import participation

        rounds = count * (event.count if isinstance(event, ev.SelfComposed) else 1)
        return participation.start_step(rounds, tolerance)
    if isinstance(inner, (ev.WithoutReplacement, ev.FixedCohort)):
        # Symmetrised C_p(G) PLDs on a uniform grid: second order and tight
        # (about 2e-3 relative at 1e-2, 1e-4 at 3e-3), and their cost grows
        # as 1/h.
        step = next(h for tol, h in _SYMMETRISED_STEPS if tolerance >= tol)
        coarse = step > 1e-2
        if not (coarse or own_scale):
            return step
        key, _ = _unrolled(event, 1)
        up, _ = _cached_price(key, schemes.resolve_analysis(key, analysis), step)
        # pylint: disable-next=protected-access
        scale = min(refine._scale(p) for p in pld._pmfs_of(up))
        fine = min(step, 1e-2)
        if own_scale and 0 < scale < fine / 2:
            # refinement would bracket on the fine grid, then rebuild here
            # (that first bracket, intersected with this one, sometimes
            # narrowed it: at 2%, up to 1.2e-2 wide without it instead of
            # 5e-3, sigma 3 at q = 0.01; at 0.5% refinement closes the gap)
            return scale
        if not coarse:
            return step
        # A run's ledger asks for 2%: a grid up to four times coarser, as
        # coarse as one round's losses allow (refine.py's scale, an eighth of
        # their deviation), keeps the bracket within a third of that (at
        # most 6.9e-3 wide) at a quarter of the cost or less (sampling rates
        # 1e-3 to 0.2, sigma 0.5 to 3, 10 to 1e5 rounds;
        # tests/accounting/test_accountant.py). A
        # scale of at least 3/4 of the coarse step keeps that step (the PLDs
        # priced to find the scale are the ones composed).
        return step if scale >= 0.75 * step else max(fine, scale)
    return refine.start_discretization(tolerance)


def _unrolled(event: ev.Event, count: int) -> tuple[ev.Event, int]:
    """``count`` releases of ``event`` as releases of what it self-composes.

    Unwraps (nested) :class:`~dpfl.accounting.events.SelfComposed` events,
    canonical at each level, multiplying ``count`` by their repetitions.
    """
    inner = canonical(event)
    while isinstance(inner, ev.SelfComposed):
        count *= inner.count
        inner = canonical(inner.event)
    return inner, count


def _gaussian_mu(items: list[tuple[ev.Event, int]]) -> float | None:
    """The GDP mu of a composition of plain Gaussians (``None`` if any is not)."""
    total = 0.0
    for event, count in items:
        inner, count = _unrolled(event, count)
        if not isinstance(inner, ev.Gaussian):
            return None
        total += count * (inner.sensitivity / inner.noise_multiplier) ** 2
    return math.sqrt(total)


#: Relative accuracy claimed for the closed forms of mu-GDP (evaluated in log
#: space to about 1e-14; the bracket keeps a margin a hundred times wider).
_CLOSED_FORM_RTOL = 1e-12


def _gaussian_epsilon_bound(delta: float, mu: float) -> Bound:
    """epsilon(delta) of mu-GDP: the certified closed form and a value below it.

    The upper value is :func:`gaussian.gdp_epsilon` (rounded up until the
    closed form meets delta); the lower value steps down from it until the
    closed form exceeds delta, so the bracket never collapses onto a value
    that roundoff could have put below the truth.
    """
    up = gaussian.gdp_epsilon(delta, mu=mu)
    if up == 0.0:
        return Bound.exact(0.0, "gaussian-exact")
    step = _CLOSED_FORM_RTOL * up
    lo = up - step
    while lo > 0.0 and gaussian.gdp_delta(lo, mu=mu) <= delta * (1 + _CLOSED_FORM_RTOL):
        step *= 2.0
        lo = up - step
    lo = max(lo, 0.0)
    return Bound(lo, 0.5 * (lo + up), up, "gaussian-exact")


def _gaussian_delta_bound(epsilon: float, mu: float) -> Bound:
    """delta(epsilon) of mu-GDP with the closed form's accuracy as margin."""
    d = gaussian.gdp_delta(epsilon, mu=mu)
    lo = d * (1.0 - _CLOSED_FORM_RTOL)
    up = min(d * (1.0 + _CLOSED_FORM_RTOL), 1.0)
    return Bound(lo, d, up, "gaussian-exact")


def _gaussian_mu2(event: ev.Event) -> float | None:
    """``mu^2`` of a (self-composed) Gaussian release, or None for other events."""
    event, reps = _unrolled(event, 1)
    if isinstance(event, ev.Gaussian):
        return reps * (event.sensitivity / event.noise_multiplier) ** 2
    return None


def _public_gaussian_roles(
    event: ev.Event, analysis: str | None
) -> list[tuple[float, float]] | None:
    """The roles ``(probability, mu^2)`` of a public-label mixture of Gaussians.

    Check-in (except under the paper's analysis, which prices it as Poisson
    sampling) and two-stage rounds, whose per-role costs are Gaussian; None
    for any other event.
    """
    if isinstance(event, ev.CheckIn):
        if schemes.resolve_analysis(event, analysis) == "paper":
            return None
    elif not isinstance(event, ev.TwoStage):
        return None
    roles = []
    for weight, cost in exclusive(costs.participant_costs(event)):
        mu2 = _gaussian_mu2(cost)
        if mu2 is None:
            return None
        roles.append((weight, mu2))
    return roles


def _mixture_bound(
    items: list[tuple[ev.Event, int]],
    analysis: str | None,
    delta: float | None,
    epsilon: float | None,
) -> Bound | None:
    """The exact GDP-mixture bracket (:mod:`dpfl.accounting.mixture`), or None.

    Applies to compositions of check-in and two-stage rounds of Gaussians (and
    plain Gaussians); None for any other event or when the enumeration of the
    participation counts would be too long (the PLD answers then).
    """
    constant = 0.0
    factors: dict[tuple[tuple[float, float], ...], int] = {}
    for event, count in items:
        inner, count = _unrolled(event, count)
        mu2 = _gaussian_mu2(inner)
        if mu2 is not None:
            constant += count * mu2
            continue
        roles = _public_gaussian_roles(inner, analysis)
        if roles is None:
            return None
        key = tuple(roles)
        factors[key] = factors.get(key, 0) + count
    if not factors:
        return None
    mix = mixture.GdpMixture.build(
        [(n, list(roles)) for roles, n in factors.items()], constant
    )
    if mix is None:
        return None
    if delta is not None:
        return mix.epsilon_bound(delta)
    return mix.delta_bound(float(epsilon))  # type: ignore[arg-type]


def _fallback_upper(
    items: list[tuple[ev.Event, int]],
    *,
    delta: float | None,
    epsilon: float | None,
) -> float | None:
    """A closed upper value for compositions of (Poisson-subsampled) Gaussians.

    The smaller of two certified values:

    * Renyi DP (:func:`_rdp_upper`), over orders from 1.01 to 10^6;
    * the closed form of the same Gaussians without sampling: a subsampled
      Gaussian pair is dominated by the Gaussian's (joint convexity of the
      hockey-stick divergence, in both directions), domination survives
      composition, and the composed Gaussians are exactly mu-GDP (Dong, Roth
      & Su 2022, Cor. 3.3). Exact at sampling probabilities near 1, where
      RDP's conversion loses a few percent.

    None when an event is of another kind.
    """
    rdp_value = _rdp_upper(items, delta=delta, epsilon=epsilon)
    if rdp_value is None:
        return None
    total = 0.0
    for event, count in items:
        inner, count = _unrolled(event, count)
        if isinstance(inner, ev.PoissonSampled):
            inner = inner.event
        mu2 = _gaussian_mu2(inner)
        if mu2 is None:
            return rdp_value
        total += count * mu2
    mu = math.sqrt(total)
    if delta is not None:
        closed = _gaussian_epsilon_bound(delta, mu).upper
    else:
        closed = _gaussian_delta_bound(float(epsilon), mu).upper  # type: ignore[arg-type]
    return min(rdp_value, closed)


#: Integer Renyi orders beyond dp_accounting's defaults (which stop at 1024):
#: tiny sampling rates with large noise need orders in the thousands and
#: beyond. Their RDP is computed by :func:`_log_a_int` (vectorised).
_LARGE_ORDERS = tuple(
    int(a) for a in np.unique(np.round(np.geomspace(1100.0, 1e6, 32)))
)


def _log_a_int(q: float, sigma: float, alpha: int) -> float:
    """An upper bound on ``log A_alpha`` of the sampled Gaussian, integer alpha.

    ``A_alpha = sum_k C(alpha, k) (1-q)^(alpha-k) q^k exp((k^2 - k)/(2 sigma^2))``
    (Mironov, Talwar & Zhang 2019, Sec. 3.3; dp_accounting's
    ``_compute_log_a_int``, a Python loop), summed in log space at once. The
    log-binomials come from ``gammaln`` (a few ulps each); a relative margin
    of ``64 u`` on the largest term's magnitude covers them.
    """
    from scipy import special  # pylint: disable=import-outside-toplevel

    k = np.arange(alpha + 1, dtype=float)
    terms = (
        special.gammaln(alpha + 1.0)
        - special.gammaln(k + 1.0)
        - special.gammaln(alpha - k + 1.0)
        + k * math.log(q)
        + (alpha - k) * math.log1p(-q)
        + (k * k - k) / (2.0 * sigma * sigma)
    )
    top = float(np.max(terms))
    value = top + math.log(float(np.sum(np.exp(terms - top))))
    scale = float(np.max(np.abs(terms))) + special.gammaln(alpha + 1.0)
    return float(value + 64 * 2.0**-53 * (scale + alpha))


def _rdp_upper(
    items: list[tuple[ev.Event, int]],
    *,
    delta: float | None,
    epsilon: float | None,
) -> float | None:
    """A Renyi-DP upper bound for compositions of (Poisson-subsampled) Gaussians.

    Mironov, Talwar and Zhang 2019 ("Renyi differential privacy of the
    sampled Gaussian mechanism") for each event, summed over the
    composition, at dp_accounting's default orders (1.1 to 1024) and at
    integer orders up to 10^6 (:data:`_LARGE_ORDERS`), converted to
    (epsilon, delta) by dp_accounting (Balle et al. 2020, Theorem 21).
    Looser than a converged PLD but certified at any number of rounds.
    ``None`` when an event is of another kind.
    """
    from dp_accounting import dp_event
    from dp_accounting.rdp import rdp_privacy_accountant as rdp_acc

    acc = rdp_acc.RdpAccountant()
    large = np.zeros(len(_LARGE_ORDERS))
    for event, count in items:
        inner, count = _unrolled(event, count)
        if isinstance(inner, ev.Gaussian):
            rate, sigma = 1.0, unit_gaussian(inner)
        elif isinstance(inner, ev.PoissonSampled):
            rate, sigma = inner.sampling_probability, unit_gaussian(inner.event)
        else:
            return None
        if sigma is None:
            return None
        with _quiet():
            acc.compose(
                dp_event.PoissonSampledDpEvent(rate, dp_event.GaussianDpEvent(sigma)),
                count,
            )
        for n, alpha in enumerate(_LARGE_ORDERS):
            if rate >= 1.0:
                one = alpha / (2.0 * sigma * sigma)
            else:
                one = _log_a_int(rate, sigma, alpha) / (alpha - 1)
            large[n] += count * one
    # pylint: disable=protected-access
    orders = [*acc._orders, *_LARGE_ORDERS]
    rdp = np.concatenate([np.asarray(acc._rdp, dtype=float), large])
    with _quiet():
        if delta is not None:
            value = float(rdp_acc.compute_epsilon(orders, rdp, delta)[0])
        else:
            value = float(rdp_acc.compute_delta(orders, rdp, float(epsilon))[0])  # type: ignore[arg-type]
    return value if math.isfinite(value) else None
