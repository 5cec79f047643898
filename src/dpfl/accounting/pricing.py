"""The price of each event: a registry of its privacy-loss distributions.

Each event class's price (an upper, certified, and a lower privacy-loss
distribution of one release under a named analysis) is registered with
:func:`prices` next to the formula that computes it, as Opacus registers a
per-layer gradient rule next to the layer's code:

* here, the standard mechanisms (dp_accounting's PLDs): :class:`Gaussian`,
  :class:`PoissonSampled`, :class:`RecordPoisson` and :class:`SelfComposed`
  (events of :mod:`dpfl.accounting.events`);
* :mod:`dpfl.accounting.participation` -- :class:`ClientPoisson` (random
  participation; client-level Poisson sampling);
* :mod:`dpfl.accounting.fdp` -- :class:`FixedCohort` and
  :class:`WithoutReplacement` (sampling without replacement, replace-one);
* :mod:`dpfl.accounting.checkin` -- :class:`CheckIn`;
* :mod:`dpfl.accounting.rdp` -- :class:`TwoStage` (LOCKS);
* :mod:`dpfl.accounting.cohorts` -- :class:`CohortRecordPoisson` (fixed-size
  cohorts with Poisson records).

:func:`canonical` normalises fields that do not change an event's price, so
that the :class:`~dpfl.accounting.accountant.Accountant` composes equal
prices once; a rule may register a canonical form beside its price. The
Accountant looks the price up with :func:`price`; importing
:mod:`dpfl.accounting` loads every module that registers one.

Adding an event: define it in :mod:`dpfl.accounting.events`, give it a scheme
in :mod:`dpfl.accounting.schemes`, and decorate its pricing function with
``@prices(MyEvent)`` in the module that computes it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TypeAlias

from dp_accounting.pld import privacy_loss_distribution as pld_lib

from dpfl.accounting import discretise, hockey, pld
from dpfl.accounting import events as ev
from dpfl.accounting._quiet import quiet as _quiet
from dpfl.errors import UnsupportedEventError

__all__ = [
    "PLD",
    "PldPair",
    "PriceRule",
    "canonical",
    "exclusive",
    "gaussian_pld_pair",
    "poisson_of_gaussian",
    "price",
    "prices",
    "public_mixture",
    "supports",
    "unit_gaussian",
]

PLD: TypeAlias = pld_lib.PrivacyLossDistribution
PldPair = tuple[PLD, PLD]
#: ``rule(event, *, analysis, discretization) -> (upper, lower)``.
PriceRule = Callable[..., PldPair]

_PRICES: dict[type[ev.Event], PriceRule] = {}


def prices(*kinds: type[ev.Event]) -> Callable[[PriceRule], PriceRule]:
    """Register the decorated function as the price of the event classes ``kinds``.

    The function is called as ``rule(event, analysis=..., discretization=...)``
    and returns the (upper, lower) PLD pair of one release. A subclass of a
    registered class uses its parent's rule unless it registers its own.

    Raises
    ------
    InvalidParameterError
        If a class already has a rule (one price per event class).
    """
    from dpfl.errors import InvalidParameterError

    def register(rule: PriceRule) -> PriceRule:
        for kind in kinds:
            if kind in _PRICES:
                raise InvalidParameterError(
                    f"event class must have one price; {kind.__name__} already has "
                    f"{_PRICES[kind].__module__}.{_PRICES[kind].__qualname__}"
                )
            _PRICES[kind] = rule
        return rule

    return register


def _rule(event: ev.Event) -> PriceRule | None:
    for kind in type(event).__mro__:
        rule = _PRICES.get(kind)
        if rule is not None:
            return rule
    return None


def supports(event: ev.Event) -> bool:
    """Whether some module registered a price for ``event``'s class."""
    return _rule(event) is not None


def price(event: ev.Event, *, analysis: str, discretization: float) -> PldPair:
    """Return (pessimistic, optimistic) PLDs of one ``event`` under ``analysis``.

    Parameters
    ----------
    event : Event
        The release to price.
    analysis : str
        Which analysis of the event's scheme to use (a name the scheme offers,
        see :mod:`dpfl.accounting.schemes`).
    discretization : float
        Value discretisation interval of the privacy-loss grid.

    Returns
    -------
    tuple of PrivacyLossDistribution
        An upper (certified) and a lower PLD.

    Raises
    ------
    UnsupportedEventError
        If no price is registered for the event's class.
    """
    rule = _rule(event)
    if rule is None:
        raise UnsupportedEventError(
            f"no privacy-loss distribution is known for event "
            f"{type(event).__name__}; supported: "
            f"{sorted(k.__name__ for k in _PRICES)}"
        )
    return rule(event, analysis=analysis, discretization=discretization)


@prices(ev.SelfComposed)
def _price_self_composed(
    event: ev.SelfComposed, *, analysis: str, discretization: float
) -> PldPair:
    up, lo = price(event.event, analysis=analysis, discretization=discretization)
    return pld.self_compose(up, event.count), pld.self_compose(lo, event.count)


@functools.singledispatch
def canonical(event: ev.Event) -> ev.Event:
    """Return the event with fields that do not affect its price normalised.

    Rounds whose events differ only in such fields are composed as one event
    (one PLD, one self-composition) instead of one by one.
    """
    return event


@canonical.register
def _(event: ev.PoissonSampled) -> ev.Event:
    # Sampling with probability 1 is no sampling: the Gaussian itself, whose
    # composition has a closed form (Dong, Roth and Su 2022, Corollary 3.3).
    if event.sampling_probability == 1.0 and isinstance(event.event, ev.Gaussian):
        return event.event
    return event


@canonical.register
def _(event: ev.RecordPoisson) -> ev.Event:
    # Without client sampling the record count d does not enter the price.
    if isinstance(event.event, ev.Gaussian):
        return canonical(ev.PoissonSampled(event.sampling_probability, event.event))
    return event


# -- standard events: dp_accounting's own PLDs ----------------------------------
def gaussian_pld_pair(
    *, noise_multiplier: float, sampling_probability: float, discretization: float
) -> PldPair:
    """Add/remove Poisson-subsampled Gaussian (sensitivity 1): upper and lower PLD.

    Built by :mod:`dpfl.accounting.pld` as the one-label mixture pair
    ``((1-q) N(0) + q N(1), N(0))``: connect-the-dots above, a grid garbling
    of the true pair below, both second-order accurate in the grid step.
    """
    q = sampling_probability
    pair = hockey.MixturePair.create([0.0, 1.0], [1.0 - q, q], [1.0, 0.0])
    with _quiet():
        up, lo = discretise.pld_bounds_from_label_mixture(
            [(1.0, pair)],
            noise_std=noise_multiplier,
            value_discretization=discretization,
            relative_spacing=min(0.05, 100.0 * discretization),
            tail_mass=_ROUND_TAIL,
        )
    return up, lo


#: Mass of one round's loss cut off at the top (it goes to +infinity in the
#: upper PLD): 1e5 rounds then leave 1e-19 at +infinity, far below the
#: smallest delta (1e-15) a query asks about.
_ROUND_TAIL = 1e-24


def unit_gaussian(event: ev.Event) -> float | None:
    """Noise multiplier per unit sensitivity if ``event`` is a Gaussian, else None."""
    if isinstance(event, ev.Gaussian):
        return event.noise_multiplier / event.sensitivity
    return None


@prices(ev.Gaussian)
def _price_gaussian(
    event: ev.Gaussian, *, analysis: str, discretization: float
) -> PldPair:
    return gaussian_pld_pair(
        noise_multiplier=event.noise_multiplier / event.sensitivity,
        sampling_probability=1.0,
        discretization=discretization,
    )


def poisson_of_gaussian(rate: float, inner: ev.Event, discretization: float) -> PldPair:
    """The Poisson-subsampled Gaussian pair at ``rate`` over a Gaussian ``inner``.

    Add/remove of one unit, in units of ``inner``'s sensitivity.

    Raises
    ------
    UnsupportedEventError
        If ``inner`` is not a :class:`~dpfl.accounting.events.Gaussian`.
    """
    sigma = unit_gaussian(inner)
    if sigma is None:
        raise UnsupportedEventError(
            f"Poisson sampling is priced over a Gaussian event; got {inner!r}"
        )
    return gaussian_pld_pair(
        noise_multiplier=sigma,
        sampling_probability=rate,
        discretization=discretization,
    )


@prices(ev.PoissonSampled)
def _price_poisson(
    event: ev.PoissonSampled, *, analysis: str, discretization: float
) -> PldPair:
    return poisson_of_gaussian(event.sampling_probability, event.event, discretization)


@prices(ev.RecordPoisson)
def _price_record_poisson(
    event: ev.RecordPoisson, *, analysis: str, discretization: float
) -> PldPair:
    # Without client sampling, a record of a client is in the round's sum w.p. q:
    # the Poisson-subsampled Gaussian at rate q (OLS, Theorem 5.1).
    return poisson_of_gaussian(event.sampling_probability, event.event, discretization)


# -- public-label mixtures (check-in, two-stage) ------------------------------
def public_mixture(
    parts: list[tuple[float, ev.Event]], analysis: str, discretization: float
) -> PldPair:
    """Price "w.p. w_j release j, and the adversary sees which" (else nothing)."""
    priced = [
        (w, price(e, analysis=analysis, discretization=discretization))
        for w, e in parts
        if w > 0
    ]
    if not priced:
        return gaussian_pld_pair(
            noise_multiplier=1.0,
            sampling_probability=0.0,
            discretization=discretization,
        )
    return (
        pld.public_mixture([(w, up) for w, (up, _) in priced]),
        pld.public_mixture([(w, lo) for w, (_, lo) in priced]),
    )


def exclusive(
    costs: dict[str, tuple[ev.Event, float]],
) -> list[tuple[float, ev.Event]]:
    """Turn "role or worse w.p. at most p_r" (worst first) into exclusive weights."""
    out: list[tuple[float, ev.Event]] = []
    covered = 0.0
    for cost, prob in costs.values():
        out.append((max(prob - covered, 0.0), cost))
        covered = max(covered, prob)
    return out
