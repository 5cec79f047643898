"""Who has been charged what: each privacy unit's spend, kept incrementally.

A :class:`~dpfl.accounting.ledger.PrivacyLedger` under a per-participant
analysis (:attr:`dpfl.accounting.schemes.Scheme.per_participant`) charges
each unit only for the rounds it took part in, at its role's cost
(:func:`dpfl.accounting.costs.charges`); every other round is charged to
every unit. The worst-off unit can only be one whose own charges no other
unit's dominate (charge every event at least as often), so the ledger prices
those units only: :class:`Spend` keeps them current as rounds are recorded,
and when every charge is a Gaussian it keeps only the most exposed one (the
composition is then mu-GDP, with mu^2 the sum of the charges').
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Sequence
from typing import Any

from dpfl.accounting import costs, schemes
from dpfl.accounting import events as ev
from dpfl.accounting.accountant import _gaussian_mu2 as _accountant_mu2
from dpfl.accounting.chain import LedgerEntry
from dpfl.accounting.pricing import canonical

__all__ = ["Profile", "Spend", "gaussian_mu2", "profile_of"]


#: A multiset of events as a hashable, order-independent key.
Profile = tuple[tuple[ev.Event, int], ...]


def profile_of(counts: Counter[ev.Event]) -> Profile:
    """A hashable, order-independent form of a multiset of events."""
    return tuple(sorted(counts.items(), key=lambda item: repr(item[0])))


def gaussian_mu2(charges: Counter[ev.Event]) -> float | None:
    """Total ``mu^2`` of charges that are all (self-composed) Gaussians, or None."""
    total = 0.0
    for event, count in charges.items():
        mu2 = _accountant_mu2(event)
        if mu2 is None:
            return None
        total += count * mu2
    return total


def _dominated(a: Counter[Any], b: Counter[Any]) -> bool:
    """Whether ``a`` charges no event more often than ``b``."""
    return all(b.get(e, 0) >= n for e, n in a.items())


_Profile = frozenset[tuple[int, int]]


@dataclasses.dataclass
class Spend:
    """Who has been charged what, under one analysis, kept incrementally.

    :meth:`update` reads only the entries appended since its last call, and
    each charge updates the set of non-dominated profiles (:meth:`front`) in
    time independent of how many units were charged before: a unit's new
    profile dominates its old one, so the front only ever gains that profile
    (unless another front profile dominates it) and loses the profiles it
    dominates, or the old one once no unit holds it. Keeping it current thus
    costs O(new charges x front size) a round. Events are interned to small
    integers, so a charge hashes integers, not events.

    Attributes
    ----------
    common : Counter
        Canonical events charged to every unit.
    """

    analysis: str | None
    seen: int = 0
    common: Counter[ev.Event] = dataclasses.field(default_factory=Counter)
    # interned events; per unit, the interned events charged to it alone
    _ids: dict[ev.Event, int] = dataclasses.field(default_factory=dict)
    _events: list[ev.Event] = dataclasses.field(default_factory=list)
    _mu2: list[float | None] = dataclasses.field(default_factory=list)
    _units: dict[int, Counter[int]] = dataclasses.field(default_factory=dict)
    # each unit's profile, the units holding each profile, each profile's
    # counts, and the non-dominated profiles
    _profile: dict[int, _Profile] = dataclasses.field(default_factory=dict)
    _members: dict[_Profile, set[int]] = dataclasses.field(default_factory=dict)
    _counts: dict[_Profile, Counter[int]] = dataclasses.field(default_factory=dict)
    _front: set[_Profile] = dataclasses.field(default_factory=set)
    # for a profile off the front, a front profile that dominated it
    _witness: dict[_Profile, _Profile] = dataclasses.field(default_factory=dict)

    def update(self, entries: Sequence[LedgerEntry]) -> Spend:
        """Charge the entries appended since the last call; returns the spend.

        A history shorter than the one seen (a rewound ledger) starts over.
        """
        if len(entries) < self.seen:  # the history was replaced: start over
            return Spend(self.analysis).update(entries)
        for entry in entries[self.seen :]:
            if entry.participants is not None and schemes.per_participant(
                entry.event, self.analysis
            ):
                interned: dict[int, int] = {}  # id(cost) -> event id, this round
                paid = costs.charges(entry.event, entry.participants, entry.extra)
                charge = self._charge
                for unit, cost in paid.items():
                    key = interned.get(id(cost))
                    if key is None:
                        key = interned[id(cost)] = self._intern(canonical(cost))
                    charge(unit, key)
            else:
                self.common[canonical(entry.event)] += 1
        self.seen = len(entries)
        return self

    def _intern(self, event: ev.Event) -> int:
        key = self._ids.get(event)
        if key is None:
            key = self._ids[event] = len(self._events)
            self._events.append(event)
            self._mu2.append(_accountant_mu2(event))
        return key

    def _charge(self, unit: int, cost: int) -> None:
        units, members = self._units, self._members
        own = units.get(unit)
        if own is None:
            own = units[unit] = Counter()
            old = None
        else:
            old = self._profile[unit]
        own[cost] = own.get(cost, 0) + 1
        new = frozenset(own.items())
        self._profile[unit] = new
        witness = None if old is None else self._witness.get(old)
        if old is not None:
            leaving = members[old]
            leaving.discard(unit)
            if not leaving:
                del members[old], self._counts[old]
                self._witness.pop(old, None)
                self._front.discard(old)
        holders = members.get(new)
        if holders is not None:
            holders.add(unit)
            return
        members[new] = {unit}
        counts = self._counts[new] = Counter(own)
        # another profile charging at least as much of everything? The one
        # that dominated the old profile usually still does: tried first.
        if witness in self._front and _dominated(counts, self._counts[witness]):
            self._witness[new] = witness
            return
        for f in self._front:
            if _dominated(counts, self._counts[f]):
                self._witness[new] = f
                return
        self._front -= {f for f in self._front if _dominated(self._counts[f], counts)}
        self._front.add(new)

    def _named(self, counts: Counter[int]) -> Counter[ev.Event]:
        return Counter({self._events[k]: n for k, n in counts.items()})

    @property
    def units(self) -> dict[int, Counter[ev.Event]]:
        """Per unit, the canonical events charged to it alone (built on use)."""
        return {unit: self._named(c) for unit, c in self._units.items()}

    def own(self, unit: int) -> Counter[ev.Event]:
        """The canonical events charged to ``unit`` alone."""
        return self._named(self._units.get(unit, Counter()))

    def front(self) -> list[Counter[ev.Event]]:
        """The non-dominated profiles' charges (without their units).

        When every charge is a Gaussian, only the profile of largest total
        ``mu^2`` (the most exposed: its composition is mu-GDP and epsilon
        grows with mu) is returned.
        """
        if not self._units:
            return [Counter()]
        mu2 = [0.0 if m is None else m for m in self._mu2]
        if all(m is not None for m in self._mu2):
            worst = max(self._front, key=lambda f: sum(n * mu2[k] for k, n in f))
            return [self._named(self._counts[worst])]
        return [self._named(self._counts[f]) for f in self._front]

    def frontier(self) -> list[tuple[int | None, Counter[ev.Event]]]:
        """The units whose own charges no other unit's dominate (one per profile).

        Only these can be the worst-off unit; each profile is represented by
        its smallest unit, in increasing order. ``(None, empty)`` when no unit
        has been charged alone.
        """
        if not self._units:
            return [(None, Counter())]
        firsts = sorted((min(self._members[f]), f) for f in self._front)
        return [(unit, self._named(self._counts[f])) for unit, f in firsts]
