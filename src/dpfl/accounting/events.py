"""Events: frozen values that describe one private release.

An event holds exactly the parameters that accounting needs, and nothing else.
The simulator's samplers *realise* an event, the training loop *emits* it into
the :class:`~dpfl.accounting.ledger.PrivacyLedger`, and an
:class:`~dpfl.accounting.accountant.Accountant` *prices* it. A field never
changes meaning; new behaviour gets a new event class.

The vocabulary (noise multipliers are noise std divided by the clipping bound):

- :class:`Gaussian` -- the Gaussian mechanism on a sum of clipped contributions.
- :class:`PoissonSampled` -- an event run on a Poisson subsample (add/remove).
- :class:`RecordPoisson` -- each of a client's ``records_per_client`` records
  joins w.p. ``sampling_probability`` (Poisson, add/remove of one record).
- :class:`ClientPoisson` -- each client joins w.p. ``sampling_probability``;
  ``ClientPoisson(p, RecordPoisson(q, d, Gaussian(s)))`` is random participation
  (Hasircioglu & Gündüz), ``ClientPoisson(p, Gaussian(s))`` a client-level
  Poisson-subsampled Gaussian.
- :class:`FixedCohort` -- exactly ``cohort_size`` of ``population`` clients,
  uniformly without replacement (client-level DP-FedAvg).
- :class:`WithoutReplacement` -- a uniform size-``sample_size`` subset of
  ``population`` records (PriFedSync local steps; replace-one).
- :class:`CheckIn` -- a client checks in w.p. ``probability`` and releases
  ``event`` (MS-PAFL; PriFedSync's client sync); the server sees who checked
  in. Replace-one.
- :class:`TwoStage` -- LOCKS: uniform first stage, norm release, then a second
  stage of expected size ``second_stage_size`` releasing the update; the
  server sees who sent what. Zero-out of a client.

What each event's guarantee means (unit, neighbouring relation, adversary)
and which analyses price it, with their status, is in
:mod:`dpfl.accounting.schemes`.
- :class:`SelfComposed` -- ``event`` repeated ``count`` times.

Examples
--------
>>> e = ClientPoisson(0.001, RecordPoisson(0.1, 30, Gaussian(2.5)))
>>> e.event.records_per_client
30
"""

from __future__ import annotations

import dataclasses
from typing import Any

from dpfl._validate import (
    check_count,
    check_positive,
    check_probability,
)
from dpfl.errors import InvalidParameterError

__all__ = [
    "CheckIn",
    "ClientPoisson",
    "Event",
    "FixedCohort",
    "Gaussian",
    "PoissonSampled",
    "RecordPoisson",
    "SelfComposed",
    "TwoStage",
    "WithoutReplacement",
    "check_cohort",
    "check_event",
    "event_from_dict",
    "event_to_dict",
    "scale_noise",
]

_REGISTRY: dict[str, type[Event]] = {}


class Event:
    """Base class of all events (frozen, slotted dataclasses)."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        _REGISTRY[cls.__name__] = cls


def check_event(name: str, value: object) -> None:
    """Raise :class:`~dpfl.errors.InvalidParameterError` unless ``value`` is an event.

    For the fields of event types, here and in the modules that add one.
    """
    if not isinstance(value, Event):
        raise InvalidParameterError(f"{name} must be a dpfl event; got {value!r}")


def check_cohort(cohort_size: int, population: int) -> None:
    """Check a fixed cohort: ``1 <= cohort_size <= population``.

    Raises
    ------
    InvalidParameterError
        Naming the parameter that is out of range.
    """
    check_count("population", population, minimum=1)
    check_count("cohort_size", cohort_size, minimum=1)
    if cohort_size > population:
        raise InvalidParameterError(
            f"cohort_size must be <= population ({population}); got {cohort_size!r}"
        )


@dataclasses.dataclass(frozen=True, slots=True)
class Gaussian(Event):
    """Gaussian noise of std ``noise_multiplier * clip`` on a clipped sum.

    Parameters
    ----------
    noise_multiplier : float
        Noise standard deviation in units of the clipping bound; > 0.
    sensitivity : float
        Norm bound of one unit's contribution in units of the clipping bound
        (1 for a clipped record or update); > 0. This is the sum's
        sensitivity under add/remove. Events whose neighbouring relation is
        replace-one (:class:`WithoutReplacement`, :class:`FixedCohort` under
        its default analysis, :class:`CheckIn`) double it themselves, since a
        replaced contribution moves the sum by up to twice its norm: do not
        pass 2 for replace-one (see :mod:`dpfl.accounting.schemes`).
    """

    noise_multiplier: float
    sensitivity: float = 1.0

    def __post_init__(self) -> None:
        check_positive("noise_multiplier", self.noise_multiplier)
        check_positive("sensitivity", self.sensitivity)


@dataclasses.dataclass(frozen=True, slots=True)
class PoissonSampled(Event):
    """``event`` run on a Poisson subsample with rate ``sampling_probability``."""

    sampling_probability: float
    event: Event

    def __post_init__(self) -> None:
        check_probability("sampling_probability", self.sampling_probability)
        check_event("event", self.event)


@dataclasses.dataclass(frozen=True, slots=True)
class RecordPoisson(Event):
    """Each of a client's records joins w.p. ``sampling_probability`` (Poisson)."""

    sampling_probability: float
    records_per_client: int
    event: Event

    def __post_init__(self) -> None:
        check_probability("record_probability", self.sampling_probability)
        check_count("records_per_client", self.records_per_client, minimum=0)
        check_event("event", self.event)


@dataclasses.dataclass(frozen=True, slots=True)
class ClientPoisson(Event):
    """Each client joins independently w.p. ``sampling_probability``."""

    sampling_probability: float
    event: Event

    def __post_init__(self) -> None:
        check_probability("participation_probability", self.sampling_probability)
        check_event("event", self.event)


@dataclasses.dataclass(frozen=True, slots=True)
class FixedCohort(Event):
    """Exactly ``cohort_size`` of ``population`` clients, uniformly, no replacement."""

    cohort_size: int
    population: int
    event: Event

    def __post_init__(self) -> None:
        check_cohort(self.cohort_size, self.population)
        check_event("event", self.event)

    @property
    def sampling_probability(self) -> float:
        """The cohort fraction m/K."""
        return self.cohort_size / self.population


@dataclasses.dataclass(frozen=True, slots=True)
class WithoutReplacement(Event):
    """A uniform subset of ``sample_size`` of ``population`` records (replace-one)."""

    sample_size: int
    population: int
    event: Event

    def __post_init__(self) -> None:
        check_count("population", self.population, minimum=1)
        check_count("sample_size", self.sample_size, minimum=1)
        if self.sample_size > self.population:
            raise InvalidParameterError(
                f"sample_size must be <= population ({self.population}); "
                f"got {self.sample_size!r}"
            )
        check_event("event", self.event)

    @property
    def sampling_probability(self) -> float:
        """The batch fraction B/n."""
        return self.sample_size / self.population


@dataclasses.dataclass(frozen=True, slots=True)
class CheckIn(Event):
    """A client checks in w.p. ``probability``, visibly, then releases ``event``.

    MS-PAFL's check-in and PriFedSync's client sync. The neighbouring relation
    is replace-one: a bare :class:`Gaussian` ``event`` is priced with twice its
    sensitivity; a sampling ``event`` (e.g. :class:`WithoutReplacement` steps)
    already states its own relation.
    """

    probability: float
    event: Event

    def __post_init__(self) -> None:
        check_probability("probability", self.probability)
        check_event("event", self.event)


@dataclasses.dataclass(frozen=True, slots=True)
class TwoStage(Event):
    """LOCKS round: a norm release, then a norm-proportional update release.

    Stage 1 is uniform w.p. ``first_stage_probability`` and releases
    ``norm_event``; stage 2 has expected size ``second_stage_size`` and releases
    ``update_event``, with per-client inclusion probability at most
    ``max_second_stage_probability``.
    """

    first_stage_probability: float
    second_stage_size: int
    max_second_stage_probability: float
    norm_event: Event
    update_event: Event

    def __post_init__(self) -> None:
        check_probability("first_stage_probability", self.first_stage_probability)
        check_count("second_stage_size", self.second_stage_size, minimum=1)
        check_probability(
            "max_second_stage_probability", self.max_second_stage_probability
        )
        check_event("norm_event", self.norm_event)
        check_event("update_event", self.update_event)


@dataclasses.dataclass(frozen=True, slots=True)
class SelfComposed(Event):
    """``event`` repeated ``count`` times (e.g. K local steps)."""

    event: Event
    count: int

    def __post_init__(self) -> None:
        check_event("event", self.event)
        check_count("count", self.count, minimum=1)


def scale_noise(event: Event, factor: float) -> Event:
    """Return ``event`` with every Gaussian's noise multiplier times ``factor``.

    Calibration of any scheme reduces to one scalar: the family
    ``factor -> scale_noise(event, factor)`` is monotone in privacy.

    Raises
    ------
    InvalidParameterError
        If ``factor`` is not > 0.
    """
    check_positive("factor", factor)
    if isinstance(event, Gaussian):
        return dataclasses.replace(
            event, noise_multiplier=event.noise_multiplier * factor
        )
    changes = {
        f.name: scale_noise(getattr(event, f.name), factor)
        for f in dataclasses.fields(event)  # type: ignore[arg-type]
        if isinstance(getattr(event, f.name), Event)
    }
    return dataclasses.replace(event, **changes) if changes else event  # type: ignore[type-var]


def event_to_dict(event: Event) -> dict[str, Any]:
    """Serialise an event to a JSON-ready dict (nested events included)."""
    out: dict[str, Any] = {"type": type(event).__name__}
    for f in dataclasses.fields(event):  # type: ignore[arg-type]
        v = getattr(event, f.name)
        out[f.name] = event_to_dict(v) if isinstance(v, Event) else v
    return out


def event_from_dict(data: dict[str, Any]) -> Event:
    """Inverse of :func:`event_to_dict`.

    Raises
    ------
    InvalidParameterError
        If the type is unknown.
    """
    data = dict(data)
    name = data.pop("type", None)
    cls = _REGISTRY.get(str(name))
    if cls is None or cls is Event:
        raise InvalidParameterError(
            f"event type must be one of {sorted(set(_REGISTRY) - {'Event'})}; "
            f"got {name!r}"
        )
    kwargs = {
        k: event_from_dict(v) if isinstance(v, dict) and "type" in v else v
        for k, v in data.items()
    }
    return cls(**kwargs)
