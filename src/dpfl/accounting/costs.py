"""What one unit pays in a round charged only to those who took part.

Some schemes' adversaries see who took part (check-in, two-stage sampling:
:attr:`dpfl.accounting.schemes.Scheme.per_participant`), so a run charges each
unit only for the rounds it took part in, at the cost of the role it played.
:func:`participant_costs` says what each role pays and how often at most (the
Accountant and the calibrator price a round from it);
:func:`charges` says what each participant of a recorded round pays (the
ledger composes them per unit).

Under these analyses the neighbouring relation is replace-one, so a bare
Gaussian's sensitivity doubles in the cost (see the sensitivity convention in
:mod:`dpfl.accounting.schemes`), and a two-stage round's second-stage
participants pay for both of their releases, combined into one Gaussian
(exact: their ``mu^2`` add up).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

from dpfl.accounting import events as ev
from dpfl.errors import InvalidParameterError, UnsupportedEventError

__all__ = ["charges", "participant_costs"]


def _replace_one(event: ev.Event) -> ev.Event:
    """``event`` as released under replace-one: a bare Gaussian's sensitivity doubles.

    Sampling events carry their own relation and are returned unchanged.
    """
    if isinstance(event, ev.Gaussian):
        return dataclasses.replace(event, sensitivity=2.0 * event.sensitivity)
    if isinstance(event, ev.SelfComposed):
        return dataclasses.replace(event, event=_replace_one(event.event))
    return event


def _combined(*gaussians: ev.Event) -> ev.Gaussian:
    """One Gaussian equal to releasing every given Gaussian (exact: mu^2 add up)."""
    inv = 0.0
    for g in gaussians:
        if not isinstance(g, ev.Gaussian):
            raise UnsupportedEventError(f"expected a Gaussian event; got {g!r}")
        inv += (g.sensitivity / g.noise_multiplier) ** 2
    return ev.Gaussian(inv**-0.5)


@functools.singledispatch
def participant_costs(event: ev.Event) -> dict[str, tuple[ev.Event, float]]:
    """What one unit pays in a round of ``event``, by role, and how often at most.

    Only for schemes with per-participant analyses (:attr:`Scheme.per_participant`).

    Returns
    -------
    dict
        ``role -> (cost event, largest probability of that role or worse)``.
        The first role is the most expensive.

    Raises
    ------
    UnsupportedEventError
        For an event whose runs charge every unit every round.
    """
    raise UnsupportedEventError(
        f"{type(event).__name__} rounds are charged to every unit, not per participant"
    )


@participant_costs.register
def _(event: ev.CheckIn) -> dict[str, tuple[ev.Event, float]]:
    return {"participant": (_replace_one(event.event), event.probability)}


@participant_costs.register
def _(event: ev.TwoStage) -> dict[str, tuple[ev.Event, float]]:
    both = _combined(event.norm_event, event.update_event)
    q1 = event.first_stage_probability
    return {
        "second_stage": (both, q1 * event.max_second_stage_probability),
        "first_stage": (_combined(event.norm_event), q1),
    }


@participant_costs.register
def _(event: ev.SelfComposed) -> dict[str, tuple[ev.Event, float]]:
    return {
        role: (ev.SelfComposed(cost, event.count), prob)
        for role, (cost, prob) in participant_costs(event.event).items()
    }


def charges(
    event: ev.Event,
    participants: tuple[int, ...] | None,
    extra: dict[str, Any] | None = None,
) -> dict[int, ev.Event]:
    """Each participant's cost in one recorded round (per-participant analyses).

    Parameters
    ----------
    event : Event
        The round's event.
    participants : tuple of int or None
        The units that took part (for two-stage rounds: the first stage).
    extra : dict, optional
        Per-round facts: ``"second_stage"`` lists the second-stage clients of a
        two-stage round.

    Returns
    -------
    dict of int to Event
        Unit id to the event it is charged.

    Raises
    ------
    UnsupportedEventError
        If the round names no participants, or the event is not per-participant.
    """
    if participants is None:
        raise UnsupportedEventError(
            f"a per-participant round of {type(event).__name__} must name its "
            "participants"
        )
    costs = participant_costs(event)
    roles = list(costs)
    if len(roles) == 1:
        cost = costs[roles[0]][0]
        return {k: cost for k in participants}
    second = set((extra or {}).get("second_stage", ()))
    stray = second - set(participants)
    if stray:
        raise InvalidParameterError(
            "second-stage clients must be first-stage participants; got "
            f"{sorted(stray)}"
        )
    top, low = costs[roles[0]][0], costs[roles[1]][0]
    return {k: top if k in second else low for k in participants}
