"""The :class:`Accountant`: composes heterogeneous events and answers bounds.

``Accountant().compose(e1).compose(e2, count=100).epsilon(1e-5)`` returns a
:class:`~dpfl.accounting.bounds.Bound`: ``upper`` is certified (pessimistic
privacy-loss distributions, connect-the-dots), ``lower`` comes from an
optimistic discretisation of the *same* analysis. The value discretisation is
refined until the two agree within ``tolerance`` (relative) or the size cap is
reached; the achieved gap is visible in the returned bound.

Events are priced by :func:`price`, a ``functools.singledispatch`` function:
each event class registers how to turn itself into an (upper, lower) pair of
dp_accounting privacy-loss distributions for a given analysis.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import warnings
from collections.abc import Callable, Iterator
from typing import Any

from dp_accounting.pld import privacy_loss_distribution as pld_lib

from dpfl.accounting import events as ev
from dpfl.accounting._checks import check_count, check_delta, check_nonnegative
from dpfl.accounting.bounds import Bound
from dpfl.errors import InvalidParameterError, UnsupportedEventError

__all__ = ["Accountant", "describe", "price", "terms"]

PLD = pld_lib.PrivacyLossDistribution
PldPair = tuple[PLD, PLD]

#: The analyses an Accountant understands; schemes map them to their own meaning.
ANALYSES = ("sound", "wcs", "paper", "ols", "cs")


@functools.singledispatch
def price(event: ev.Event, *, analysis: str, discretization: float) -> PldPair:
    """Return (pessimistic, optimistic) PLDs of one ``event`` under ``analysis``.

    Parameters
    ----------
    event : Event
        The release to price.
    analysis : str
        Which analysis of the event's scheme to use (``"sound"`` by default).
    discretization : float
        Value discretisation interval of the privacy-loss grid.

    Returns
    -------
    tuple of PrivacyLossDistribution
        An upper (certified) and a lower PLD.

    Raises
    ------
    UnsupportedEventError
        If no pricing is registered for the event's class.
    """
    raise UnsupportedEventError(
        f"no privacy-loss distribution is known for event {type(event).__name__}; "
        f"supported: {sorted(c.__name__ for c in price.registry if c is not object)}"
    )


@price.register
def _(event: ev.SelfComposed, *, analysis: str, discretization: float) -> PldPair:
    up, lo = price(event.event, analysis=analysis, discretization=discretization)
    return up.self_compose(event.count), lo.self_compose(event.count)


@functools.singledispatch
def terms(event: ev.Event) -> dict[str, str]:
    """Return ``{"unit", "neighbouring", "adversary"}`` for an event's scheme."""
    return {
        "unit": "record",
        "neighbouring": "add/remove",
        "adversary": "sees every released noisy output",
    }


class Accountant:
    """Compose events and report (ε, δ) as bounds.

    Parameters
    ----------
    analysis : str
        The analysis used for schemes that offer several (``"sound"`` default).
    tolerance : float
        Target relative gap between the upper and lower bound.
    discretization : float or None
        Starting value discretisation; ``None`` picks one from the events.
    min_discretization : float
        Refinement stops at this discretisation.
    max_support : int
        Refinement stops before a composed PLD would exceed this many grid
        points (memory and time cap; about 32 MB per direction).

    Examples
    --------
    >>> from dpfl.accounting.events import Gaussian
    >>> acc = Accountant().compose(Gaussian(1.0), count=4)
    >>> round(acc.epsilon(1e-5).upper, 2)
    8.43
    """

    def __init__(
        self,
        analysis: str = "sound",
        *,
        tolerance: float = 0.02,
        discretization: float | None = None,
        min_discretization: float = 1e-7,
        max_support: int = 4_000_000,
    ) -> None:
        self.analysis = analysis
        self.tolerance = tolerance
        self.discretization = discretization
        self.min_discretization = min_discretization
        self.max_support = max_support
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
    def _composed(self, h: float) -> tuple[PLD | None, PLD | None]:
        counts: dict[ev.Event, int] = {}
        for e, n in self._events:
            counts[e] = counts.get(e, 0) + n
        up: PLD | None = None
        lo: PLD | None = None
        for e, n in counts.items():
            u, low = _cached_price(e, self.analysis, h)
            u, low = u.self_compose(n), low.self_compose(n)
            up = u if up is None else up.compose(u)
            lo = low if lo is None else lo.compose(low)
        return up, lo

    def _refine(self, query: Callable[[PLD], float]) -> Bound:
        if not self._events:
            return Bound.exact(0.0)
        h = self.discretization or _default_discretization(self._events)
        best: Bound | None = None
        while True:
            up, lo = self._composed(h)
            if up is None or lo is None:  # unreachable: events is non-empty
                return Bound.exact(0.0)
            u, low = query(up), query(lo)
            low = min(low, u)
            best = Bound(low, 0.5 * (low + u), u)
            if (
                best.gap <= self.tolerance
                or h / 4 < self.min_discretization
                or 4 * _support_size(up) > self.max_support
            ):
                return best
            h /= 4

    def epsilon(self, delta: float) -> Bound:
        """Smallest ε with the composition (ε, δ)-DP, as a bound."""
        delta = check_delta("delta", delta)
        return self._refine(lambda p: float(p.get_epsilon_for_delta(delta)))

    def delta(self, epsilon: float) -> Bound:
        """δ(ε) of the composition, as a bound."""
        epsilon = check_nonnegative("epsilon", epsilon)
        return self._refine(lambda p: float(p.get_delta_for_epsilon(epsilon)))


# -- standard events: dp_accounting's own PLDs ----------------------------------
def gaussian_pld_pair(
    *, noise_multiplier: float, sampling_probability: float, discretization: float
) -> PldPair:
    """Add/remove Poisson-subsampled Gaussian (sensitivity 1): upper and lower PLD."""
    with _quiet():
        kw: dict[str, Any] = {
            "standard_deviation": noise_multiplier,
            "sensitivity": 1.0,
            "sampling_prob": sampling_probability,
            "value_discretization_interval": discretization,
        }
        up = pld_lib.from_gaussian_mechanism(pessimistic_estimate=True, **kw)
        lo = pld_lib.from_gaussian_mechanism(
            pessimistic_estimate=False, use_connect_dots=False, **kw
        )
    return up, lo


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Silence dp_accounting's warnings and root-logger chatter."""
    previous = logging.root.manager.disable
    logging.disable(logging.WARNING)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logging.disable(previous)


def _unit_gaussian(event: ev.Event) -> float | None:
    """Noise multiplier per unit sensitivity if ``event`` is a Gaussian, else None."""
    if isinstance(event, ev.Gaussian):
        return event.noise_multiplier / event.sensitivity
    return None


@price.register
def _(event: ev.Gaussian, *, analysis: str, discretization: float) -> PldPair:
    return gaussian_pld_pair(
        noise_multiplier=event.noise_multiplier / event.sensitivity,
        sampling_probability=1.0,
        discretization=discretization,
    )


def _poisson_of_gaussian(
    rate: float, inner: ev.Event, discretization: float
) -> PldPair:
    sigma = _unit_gaussian(inner)
    if sigma is None:
        raise UnsupportedEventError(
            f"Poisson sampling is priced over a Gaussian event; got {inner!r}"
        )
    return gaussian_pld_pair(
        noise_multiplier=sigma,
        sampling_probability=rate,
        discretization=discretization,
    )


@price.register
def _(event: ev.PoissonSampled, *, analysis: str, discretization: float) -> PldPair:
    return _poisson_of_gaussian(event.sampling_probability, event.event, discretization)


@price.register
def _(event: ev.RecordPoisson, *, analysis: str, discretization: float) -> PldPair:
    # Without client sampling, a record of a client is in the round's sum w.p. q:
    # the Poisson-subsampled Gaussian at rate q (OLS, Theorem 5.1).
    return _poisson_of_gaussian(event.sampling_probability, event.event, discretization)


def _support_size(pld: PLD) -> int:
    """Number of grid points of a PLD's larger direction (dense PMFs)."""
    sizes = []
    for pmf in (pld._pmf_remove, pld._pmf_add):  # noqa: SLF001 (dp_accounting has no accessor)
        probs = getattr(pmf, "_probs", None)
        sizes.append(len(probs) if probs is not None else 0)
    return max(sizes)


@functools.lru_cache(maxsize=64)
def _cached_price(event: ev.Event, analysis: str, h: float) -> PldPair:
    return price(event, analysis=analysis, discretization=h)


def _default_discretization(items: list[tuple[ev.Event, int]]) -> float:
    """A grid fine enough that T·h stays well below the expected ε."""
    total = sum(n for _, n in items)
    return float(min(1e-4, max(1e-7, 1e-3 / math.sqrt(total))))


def describe(event: ev.Event) -> dict[str, Any]:
    """Return the guarantee's terms for ``event`` (see :func:`terms`)."""
    return dict(terms(event))
