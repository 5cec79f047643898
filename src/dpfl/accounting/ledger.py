"""The privacy ledger: what a run has spent, persisted atomically, with a guard.

A :class:`PrivacyLedger` records each round's event (the same value the sampler
realised) and, for schemes whose guarantee depends on who took part, the
clients that took part. It answers the spend so far as a bound, each client's
own spend, and refuses (raises :class:`~dpfl.errors.BudgetExceededError`)
a round that would take the run past its budget, *before* the round runs.

"ε spent" always means the ε of the **worst-off privacy unit** under the
ledger's analysis. For schemes that price who takes part into every round
(Poisson or fixed cohorts, random participation), every unit has the same
spend. For schemes whose adversary sees who took part (check-in, two-stage
sampling; :attr:`dpfl.accounting.schemes.Scheme.per_participant`), a unit pays
only for the rounds it took part in: the ledger composes each unit's own
releases, reports the most exposed unit, and its guard stops the run before
any unit would pass the budget. Stopping on realised participation keeps the
guarantee: the participation draws do not depend on the data, and where a
later draw depends on earlier released outputs (LOCKS's second stage) every
charge is Gaussian and the stop rule is a Gaussian-DP filter (Smith &
Thakurta 2022, "Fully adaptive composition for Gaussian differential
privacy").

The JSON file on disk is the truth: :meth:`PrivacyLedger.save` writes a
temporary file and renames it over the old one (atomic on POSIX),
:meth:`PrivacyLedger.flush` appends the rounds since to a journal, and
:meth:`PrivacyLedger.load` restores the exact spend of a stopped run.

Checksums. Entries form a hash chain: entry ``i`` carries
``chain_i = sha256(chain_{i-1}, entry_i, digest_i)``, where ``digest_i`` is the
digest of the model the round released, starting from the SHA-256 of the
ledger's header (budget, analysis, guard, tolerance, the digest of the run it
belongs to and the fingerprint of the run's secret key), and each journal line
carries its own link. A checkpoint records the chain hash at its round, so
the chain ties it to every model released up to then. :meth:`load`
recomputes the chain and refuses a file whose entries, header or count were
changed, dropped or cut short (a torn *last* journal line, a crash
mid-append, is the one thing skipped: that round was never checkpointed). The
chain detects accidents and careless edits; it does not stop someone with
write access who recomputes the hashes (dpfl holds no secret to sign with).

Replay. Each entry records what its round released: the event, the
participants, the extra facts and a ``digest`` of the model after the round.
A run resumed from a checkpoint older than the ledger rewinds it
(:meth:`PrivacyLedger.rewind`) to the checkpoint's entry count: the later
entries stay on disk and in the spend written out, and each replayed round
*confirms* its entry
(:meth:`record` compares every field) instead of being charged again; a
round that replays differently raises :class:`LedgerMismatchError`.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import tempfile
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, ClassVar

from dpfl._files import digest as _digest
from dpfl._files import fault
from dpfl._validate import check_delta, check_positive
from dpfl.accounting import costs, gaussian, schemes
from dpfl.accounting import events as ev
from dpfl.accounting.accountant import Accountant, composed_epsilon
from dpfl.accounting.accountant import _gaussian_mu2 as _accountant_mu2
from dpfl.accounting.bounds import Bound
from dpfl.accounting.pricing import canonical
from dpfl.errors import (
    BudgetExceededError,
    DpflError,
    InvalidParameterError,
)

__all__ = [
    "Budget",
    "Guard",
    "LedgerEntry",
    "LedgerMismatchError",
    "PrivacyLedger",
    "guard_names",
    "register_guard",
]

_FORMAT = 3


class LedgerMismatchError(DpflError):
    """A replayed round does not match the ledger entry it should confirm."""


@dataclasses.dataclass(frozen=True)
class Budget:
    """A total (ε, δ) budget for a run."""

    epsilon: float
    delta: float

    def __post_init__(self) -> None:
        check_positive("budget epsilon", self.epsilon, allow_inf=True)
        check_delta("budget delta", self.delta)


@dataclasses.dataclass(frozen=True)
class LedgerEntry:
    """One round: its index, its event, and (optionally) who took part.

    ``extra`` holds scheme-specific per-round facts that per-client accounting
    needs (e.g. LOCKS' second-stage clients), as JSON-ready values.
    ``digest`` is a SHA-256 of what the round released (the trainer records
    the model's weights after the round), so that a replayed round can be
    confirmed against it. It is not part of the entry's accounting content
    (:meth:`to_json`, equality): two executors that round differently charge
    the same entries.
    """

    round: int
    event: ev.Event
    participants: tuple[int, ...] | None = None
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)
    digest: str | None = dataclasses.field(default=None, compare=False)

    def to_json(self) -> dict[str, Any]:
        """Return a JSON-ready dict."""
        out: dict[str, Any] = {
            "round": self.round,
            "event": ev.event_to_dict(self.event),
        }
        if self.participants is not None:
            out["participants"] = list(self.participants)
        if self.extra:
            out["extra"] = self.extra
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> LedgerEntry:
        """Inverse of :meth:`to_json`."""
        parts = data.get("participants")
        return cls(
            round=int(data["round"]),
            event=ev.event_from_dict(data["event"]),
            participants=None if parts is None else tuple(int(k) for k in parts),
            extra=dict(data.get("extra", {})),
        )


def _link(previous: str, entry: dict[str, Any], digest: str | None) -> str:
    """The chain hash after ``entry`` (its JSON form and model digest)."""
    return _digest([previous, entry, digest])


def _normal(entry: LedgerEntry) -> dict[str, Any]:
    """An entry's JSON form as it reads back from a file (tuples as lists)."""
    out: dict[str, Any] = json.loads(json.dumps(entry.to_json()))
    return out


def _journal(path: Path) -> Path:
    return path.with_name(path.name + ".journal")


Profile = tuple[tuple[ev.Event, int], ...]


def _key(counts: Counter[ev.Event]) -> Profile:
    """A hashable, order-independent form of a multiset of events."""
    return tuple(sorted(counts.items(), key=lambda item: repr(item[0])))


def _gaussian_mu2(charges: Counter[ev.Event]) -> float | None:
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
class _Spend:
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

    def update(self, entries: Sequence[LedgerEntry]) -> _Spend:
        if len(entries) < self.seen:  # the history was replaced: start over
            return _Spend(self.analysis).update(entries)
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


class Guard:
    """A budget guard: the rule by which a ledger refuses the next round.

    The base class is the Accountant's rule (name ``"accountant"``): refuse a
    round after which the worst-off unit's certified ε, under the ledger's
    analysis, would pass the budget. Other rules (a paper's own stop rule)
    subclass it in :mod:`dpfl.accounting.guards`, register themselves by name
    with :func:`register_guard`, and are passed as
    ``PrivacyLedger(budget, guard=...)``; the ledger saves the name, and
    :meth:`PrivacyLedger.load` restores the rule from it.
    """

    #: The name saved with a ledger (``privacy.guard`` in a run config).
    name: ClassVar[str] = "accountant"

    @property
    def analysis(self) -> str | None:
        """The analysis the rule prices under (``None``: the ledger's own)."""
        return None

    def check(self, ledger: PrivacyLedger, event: ev.Event) -> None:
        """Raise :class:`~dpfl.errors.BudgetExceededError` to refuse ``event``."""
        ledger.accountant_check(event)

    def epsilon(
        self, ledger: PrivacyLedger, delta: float, analysis: str | None
    ) -> Bound | None:
        """ε spent under ``analysis`` by this rule's own computation.

        ``None`` (the default) lets the ledger's Accountant answer.
        """
        return None


#: The guards by name, filled by :func:`register_guard`.
_GUARDS: dict[str, type[Guard]] = {Guard.name: Guard}


def register_guard(cls: type[Guard]) -> type[Guard]:
    """Register a :class:`Guard` subclass under its ``name`` (a decorator)."""
    _GUARDS[cls.name] = cls
    return cls


def guard_names() -> tuple[str, ...]:
    """The registered guards' names, sorted."""
    return tuple(sorted(_GUARDS))


def _guard_named(name: str) -> Guard:
    try:
        return _GUARDS[name]()
    except KeyError:
        raise InvalidParameterError(
            f"guard must be one of {list(guard_names())}; got {name!r}"
        ) from None


class PrivacyLedger:
    """Per-run record of privacy events, with a budget guard.

    Parameters
    ----------
    budget : Budget or None
        The run's total (ε, δ); ``None`` records without a guard.
    analysis : str or None
        The analysis used to price events; ``None`` uses each scheme's default
        (its tightest proven analysis, :mod:`dpfl.accounting.schemes`).
    path : str or Path or None
        Where :meth:`save` writes; ``None`` keeps the ledger in memory.
    tolerance : float
        Relative bracket width passed to the :class:`Accountant`.
    run : str or None
        Digest of the run the ledger belongs to (a run folder's identity:
        frozen configuration, key and data fingerprints); part of the header
        the hash chain starts from.
    key : str or None
        Fingerprint of the run's secret noise key (never the key); part of
        the header the hash chain starts from.
    guard : Guard or None
        The stop rule (default: the Accountant's, :class:`Guard`); a guard
        with its own analysis sets the ledger's when ``analysis`` is None.

    Attributes
    ----------
    guard : str
        The stop rule's name, saved with the ledger so that :meth:`load`
        restores the same rule.
    """

    def __init__(
        self,
        budget: Budget | None = None,
        *,
        analysis: str | None = None,
        path: str | Path | None = None,
        tolerance: float = 0.02,
        run: str | None = None,
        key: str | None = None,
        guard: Guard | None = None,
    ) -> None:
        self.stop_rule = Guard() if guard is None else guard
        self.guard: str = self.stop_rule.name
        self.budget = budget
        self.analysis = schemes.check_analysis_name(analysis or self.stop_rule.analysis)
        self.path = None if path is None else Path(path)
        self.tolerance = tolerance
        self.run = run
        self.key = key
        self._entries: list[LedgerEntry] = []
        self._chain: list[str] = []  # chain hash after each confirmed entry
        # entries read from disk past a rewind: released, awaiting their replay
        self._pending: list[tuple[LedgerEntry, str]] = []
        # per event: (largest count known to fit, smallest count known not to)
        self._known: dict[ev.Event, tuple[int, float]] = {}
        self._persisted = 0  # entries already on disk (snapshot + journal)
        self._compact = False  # rewrite the snapshot at the next flush
        self._spend: dict[str | None, _Spend] = {}
        self._priced: dict[tuple[str | None, Profile, float], Bound] = {}
        self._mu2_cap: float | None = None  # largest Gaussian mu^2 in budget

    # -- recording ------------------------------------------------------------
    @property
    def entries(self) -> list[LedgerEntry]:
        """The recorded rounds, in order."""
        return list(self._entries)

    @property
    def rounds(self) -> int:
        """Number of recorded rounds (during a replay: confirmed so far)."""
        return len(self._entries)

    @property
    def released(self) -> int:
        """Rounds on record, including those awaiting their replay (>= rounds)."""
        return len(self._entries) + len(self._pending)

    @property
    def replaying(self) -> bool:
        """Whether entries read from disk still await their replayed round."""
        return bool(self._pending)

    def _header(self) -> dict[str, Any]:
        return {
            "guard": self.guard,
            "analysis": self.analysis,
            "budget": None if self.budget is None else dataclasses.asdict(self.budget),
            "tolerance": self.tolerance,
            "run": self.run,
            "key": self.key,
        }

    def chain_at(self, count: int) -> str:
        """The chain hash after the first ``count`` entries (the header's at 0).

        Raises
        ------
        DpflError
            If the ledger holds fewer than ``count`` confirmed entries.
        """
        if not 0 <= count <= len(self._chain):
            raise DpflError(
                f"the ledger holds {len(self._chain)} entries; asked for the chain "
                f"after {count}"
            )
        return self._chain[count - 1] if count else _digest(self._header())

    def _append(self, entry: LedgerEntry) -> None:
        self._chain.append(
            _link(self.chain_at(len(self._entries)), _normal(entry), entry.digest)
        )
        self._entries.append(entry)

    def rewind(self, count: int) -> None:
        """Hold the entries past the first ``count`` for their rounds' replay.

        For a run resumed from a checkpoint taken after ``count`` entries: the
        later entries stay on record (and in every file :meth:`save` and
        :meth:`flush` write, so the spend on disk never drops), and each is
        confirmed by :meth:`record` when its round runs again, not charged
        twice. Queries (:meth:`epsilon`, the guard) see the confirmed entries,
        as the uninterrupted run did at that round.

        Raises
        ------
        DpflError
            If ``count`` is more than the entries on record (a checkpoint
            newer than its ledger: the spend is never reset).
        """
        total = self.released
        if not 0 <= count <= total:
            raise DpflError(
                f"the ledger holds {total} charged rounds but the checkpoint was "
                f"taken after {count}: refusing to resume with a smaller spend"
            )
        every, chains = self._all()
        self._entries, self._chain = every[:count], chains[:count]
        self._pending = list(zip(every[count:], chains[count:], strict=True))
        self._spend.clear()

    def _all(self) -> tuple[list[LedgerEntry], list[str]]:
        """Every entry on record and its chain hash (confirmed, then pending)."""
        return (
            self._entries + [e for e, _ in self._pending],
            self._chain + [c for _, c in self._pending],
        )

    def record(
        self,
        event: ev.Event,
        *,
        participants: Iterable[int] | None = None,
        round: int | None = None,
        extra: dict[str, Any] | None = None,
        digest: str | None = None,
    ) -> LedgerEntry:
        """Record one round's event (after checking the budget); returns the entry.

        During a replay (:meth:`rewind`) the round is not charged again: the
        entry is compared with the next one on record and confirmed.

        Parameters
        ----------
        event : Event
            The round's event.
        participants : iterable of int, optional
            The units that took part; needed by per-participant schemes
            (without them the round is charged to every unit, priced with its
            sampling).
        round : int, optional
            The round's index (default: the number of rounds recorded).
        extra : dict, optional
            Per-round facts (two-stage rounds: ``"second_stage"``).
        digest : str, optional
            SHA-256 of what the round released (the model after the round).

        Raises
        ------
        BudgetExceededError
            If recording ``event`` would exceed the budget; nothing is recorded.
        LedgerMismatchError
            During a replay, if the entry differs from the one on record.
        """
        entry = LedgerEntry(
            round=self.rounds if round is None else int(round),
            event=event,
            participants=None
            if participants is None
            else tuple(sorted({int(k) for k in participants})),
            extra=dict(extra or {}),
            digest=digest,
        )
        if self._pending:
            return self._confirm(entry)
        self.check(event)
        self._append(entry)
        return entry

    def _confirm(self, entry: LedgerEntry) -> LedgerEntry:
        """Confirm a replayed round against the next entry on record."""
        expected, chain = self._pending[0]
        got, want = _normal(entry), _normal(expected)
        got["digest"], want["digest"] = entry.digest, expected.digest
        if got != want:
            fields = sorted(k for k in {*got, *want} if got.get(k) != want.get(k))
            raise LedgerMismatchError(
                f"round {entry.round + 1} replayed differently from the ledger "
                f"entry it must confirm ({', '.join(fields)} differ): the run "
                "cannot resume exactly (was the code, the execution, the device, "
                "the number of torch threads or the data changed?); the ledger "
                "keeps its "
                f"{self.released} charged rounds"
            )
        self._pending.pop(0)
        self._append(expected)
        if self._chain[-1] != chain:  # the same entry must link the same way
            raise LedgerMismatchError(
                f"ledger entry {len(self._entries)} (round {entry.round + 1}) does "
                "not link to the entries before it"
            )
        return expected

    # -- queries --------------------------------------------------------------
    def accountant(
        self, events: Iterable[ev.Event] | None = None, *, analysis: str | None = None
    ) -> Accountant:
        """An :class:`Accountant` holding ``events`` (default: every recorded one).

        ``analysis`` overrides the ledger's analysis (e.g. to report a paper's
        bound beside the proven one).
        """
        acc = Accountant(analysis or self.analysis, tolerance=self.tolerance)
        for e in self._events() if events is None else events:
            acc.compose(e)
        return acc

    def _events(self) -> list[ev.Event]:
        return [e.event for e in self._entries]

    def _summary(self, analysis: str | None) -> _Spend:
        """Who has been charged what under ``analysis``, brought up to date."""
        spend = self._spend.get(analysis) or _Spend(analysis)
        self._spend[analysis] = spend = spend.update(self._entries)
        return spend

    def _delta(self, delta: float | None) -> float:
        if delta is not None:
            return delta
        if self.budget is None:
            raise DpflError("delta must be given when the ledger has no budget")
        return self.budget.delta

    def _bound(
        self, charges: Counter[ev.Event], delta: float, analysis: str | None
    ) -> Bound:
        """ε at ``delta`` of one unit charged ``charges`` (memoised)."""
        key = (analysis, _key(charges), delta)
        if key not in self._priced:
            self._priced[key] = composed_epsilon(
                key[1], delta, analysis=analysis, tolerance=self.tolerance
            )
        return self._priced[key]

    def worst_unit(
        self, delta: float | None = None, *, analysis: str | None = None
    ) -> tuple[int | None, Bound]:
        """The worst-off unit and its ε so far.

        Parameters
        ----------
        delta : float, optional
            Target δ (default: the budget's).
        analysis : str, optional
            Overrides the ledger's analysis.

        Returns
        -------
        (int or None, Bound)
            The unit (``None`` when every unit is charged alike) and its ε.
        """
        name = analysis or self.analysis
        d = self._delta(delta)
        own = self.stop_rule.epsilon(self, d, name)
        if own is not None:  # the guard's rule: every unit charged alike
            return None, own
        spend = self._summary(name)
        priced = [
            (unit, self._bound(spend.common + own, d, name))
            for unit, own in spend.frontier()
        ]
        return max(priced, key=lambda item: item[1].upper)

    def epsilon(
        self, delta: float | None = None, *, analysis: str | None = None
    ) -> Bound:
        """ε spent so far by the worst-off unit, at ``delta`` (default: the budget's).

        Parameters
        ----------
        delta : float, optional
            Target δ.
        analysis : str, optional
            Overrides the ledger's analysis.

        Returns
        -------
        Bound
            The worst-off unit's ε (every unit's, when all are charged alike).
        """
        return self.worst_unit(delta, analysis=analysis)[1]

    def client_rounds(self, client: int) -> int:
        """Rounds in which ``client`` is recorded as a participant."""
        return sum(
            1
            for e in self._entries
            if e.participants is not None and client in e.participants
        )

    def client_epsilon(
        self, client: int, delta: float | None = None, *, analysis: str | None = None
    ) -> Bound:
        """ε of one client: the rounds charged to everyone and its own charges."""
        name = analysis or self.analysis
        spend = self._summary(name)
        own = spend.own(int(client))
        return self._bound(spend.common + own, self._delta(delta), name)

    # -- the guard ------------------------------------------------------------
    def check(self, event: ev.Event) -> None:
        """Raise :class:`BudgetExceededError` if adding ``event`` exceeds the budget.

        The ledger's :class:`Guard` decides (by default
        :meth:`accountant_check`).
        """
        self.stop_rule.check(self, event)

    def accountant_check(self, event: ev.Event) -> None:
        """The Accountant's stop rule (:class:`Guard`'s default).

        The next round is assumed to charge every potentially worst-off unit
        its most expensive cost (per-participant schemes: as if each took
        part in the most exposed role); the check passes only if each stays
        within the budget.
        """
        if self.budget is None or math.isinf(self.budget.epsilon):
            return
        spend = self._summary(self.analysis)
        if schemes.per_participant(event, self.analysis):
            roles = costs.participant_costs(event)
            nxt = canonical(next(iter(roles.values()))[0])
        else:
            nxt = canonical(event)
        for own in spend.front():
            charges = spend.common + own
            charges[nxt] += 1
            if not self._within_budget(charges):
                raise BudgetExceededError(
                    f"round {self.rounds + 1} would exceed the budget "
                    f"(epsilon={self.budget.epsilon}, delta={self.budget.delta}) "
                    f"under the {self._analysis_name(event)!r} analysis; stopped "
                    f"before it ({self.rounds} rounds spent)"
                )

    def _analysis_name(self, event: ev.Event) -> str:
        return schemes.resolve_analysis(event, self.analysis)

    def _within_budget(self, charges: Counter[ev.Event]) -> bool:
        if len(charges) == 1:
            # One event type (the common case): find once how many of it the
            # budget allows, then compare counts (amortised O(1) a round).
            ((event, count),) = charges.items()
            return self._fits(event, count)
        if self.budget is None:
            return True
        mu2 = _gaussian_mu2(charges)
        if mu2 is not None:
            # Gaussian charges only (per-participant schemes): the composition
            # is mu-GDP with mu^2 their sum, within budget iff mu <= the mu of
            # the budget's (epsilon, delta); found once, with a 1e-9 margin.
            return mu2 <= self._mu2_budget()
        bound = self._bound(charges, self.budget.delta, self.analysis)
        return bound.upper <= self.budget.epsilon

    def _mu2_budget(self) -> float:
        if self._mu2_cap is None:
            assert self.budget is not None
            mu = gaussian.gdp_mu(epsilon=self.budget.epsilon, delta=self.budget.delta)
            self._mu2_cap = (mu * (1.0 - 1e-9)) ** 2
        return self._mu2_cap

    def _fits(self, event: ev.Event, count: int) -> bool:
        """Whether ``count`` rounds of ``event`` fit the budget (amortised).

        Looks ahead to the next power of two; once a count is known not to
        fit, bisects between the largest count known to fit and it, which pins
        the last round the budget allows. A run of T rounds thus prices
        O(log T) compositions in all (not one per round near the end of a run
        calibrated to spend the budget), none much longer than the run.
        Certifying every count up to one whose upper bound fits is sound: the
        true ε grows with the number of rounds.
        """
        fits_up_to, fails_from = self._known.get(event, (0, math.inf))
        if count <= fits_up_to:
            return True
        if count >= fails_from:
            return False
        budget = self.budget.epsilon  # type: ignore[union-attr]
        ahead = 1 << (count - 1).bit_length()  # next power of two >= count
        while fits_up_to < count < fails_from:
            if math.isinf(fails_from):
                t = ahead
            else:
                t = (fits_up_to + int(fails_from)) // 2 if fits_up_to else count
            if self._epsilon_of(event, t) <= budget:
                fits_up_to = max(fits_up_to, t)
            else:
                fails_from = min(fails_from, t)
            self._known[event] = (fits_up_to, fails_from)
        return count <= fits_up_to

    def _epsilon_of(self, event: ev.Event, count: int) -> float:
        bound = composed_epsilon(
            ((event, count),),
            self.budget.delta,  # type: ignore[union-attr]
            analysis=self.analysis,
            tolerance=self.tolerance,
        )
        return bound.upper

    def max_rounds(self, event: ev.Event, limit: int = 1_000_000) -> int:
        """Largest T <= ``limit`` with T rounds of ``event`` within the budget."""
        if self.budget is None or math.isinf(self.budget.epsilon):
            return limit
        event = canonical(event)
        if not self._fits(event, 1):
            return 0
        lo, hi = 1, 2
        while hi <= limit and self._fits(event, hi):
            lo, hi = hi, 2 * hi
        hi = min(hi, limit + 1)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if self._fits(event, mid) else (lo, mid)
        return lo

    def summary(self, delta: float | None = None) -> dict[str, Any]:
        """What the run has spent, with every term of the guarantee.

        Parameters
        ----------
        delta : float, optional
            Target δ (default: the budget's).

        Returns
        -------
        dict
            ``rounds``, ``epsilon`` (worst-off unit, upper bound),
            ``epsilon_lower``, ``delta``, ``worst_unit`` and, per distinct
            event, the terms (``scheme``, ``unit``, ``neighbouring``,
            ``adversary``, ``analysis``, ``status``, ``basis``); when the
            analysis is not proven, ``proven`` holds the same figures under
            the scheme's default analysis.
        """
        out: dict[str, Any] = {"rounds": self.rounds, "guard": self.guard}
        if not self._entries:
            return out
        d = self._delta(delta)
        unit, bound = self.worst_unit(d)
        terms = schemes.describe(self._entries[-1].event, self.analysis)
        out.update(
            epsilon=bound.upper,
            epsilon_lower=bound.lower,
            delta=d,
            worst_unit=unit,
            **terms,
        )
        if terms["status"] != "proven":
            default = schemes.scheme_of(self._entries[-1].event).default
            unit_p, bound_p = self.worst_unit(d, analysis=default)
            out["proven"] = {
                "analysis": default,
                "epsilon": bound_p.upper,
                "worst_unit": unit_p,
                **{
                    k: v
                    for k, v in schemes.describe(
                        self._entries[-1].event, default
                    ).items()
                    if k in ("adversary", "neighbouring", "status")
                },
            }
        return out

    # -- persistence ----------------------------------------------------------
    def released_ledger(self) -> PrivacyLedger:
        """The ledger as released: itself, or mid-replay a copy with every entry.

        What the run has released so far (the spend a report must show), in
        memory (no path).
        """
        if not self._pending:
            return self
        copy = PrivacyLedger(
            self.budget,
            analysis=self.analysis,
            tolerance=self.tolerance,
            run=self.run,
            key=self.key,
            guard=self.stop_rule,
        )
        copy._entries, copy._chain = self._all()
        return copy

    def to_json(self) -> dict[str, Any]:
        """Return the ledger as a JSON-ready dict (every entry on record).

        Each entry carries its ``chain`` hash; ``count`` and ``head`` (the
        last chain hash) close the chain.
        """
        entries, chains = self._all()
        return {
            "format": _FORMAT,
            **self._header(),
            "summary": self.released_ledger()._saved_summary(),
            "count": len(entries),
            "head": chains[-1] if chains else _digest(self._header()),
            "entries": [
                {**e.to_json(), "chain": c}
                for e, c in zip(entries, chains, strict=True)
            ],
            "digests": [e.digest for e in entries],
        }

    def _saved_summary(self) -> dict[str, Any] | None:
        """The :meth:`summary` written into the file (``None`` without a δ)."""
        if self.budget is None or not self._entries:
            return None
        try:
            return self.summary()
        except DpflError:  # e.g. an event no analysis prices: keep the entries
            return None

    def save(self, path: str | Path | None = None) -> Path:
        """Write the whole ledger atomically (temporary file, fsync, rename).

        The snapshot holds every entry, so the journal of :meth:`flush` is
        removed afterwards (entries it still holds are checked against the
        snapshot and skipped on load).
        """
        target = self._target(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
        try:
            with os.fdopen(fd, "w") as fh:
                json.dump(self.to_json(), fh, indent=1)
                fh.flush()
                os.fsync(fh.fileno())
            fault("ledger-save")
            os.replace(tmp, target)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
        _journal(target).unlink(missing_ok=True)
        self._persisted = self.released
        self._compact = False
        return target

    def flush(self, path: str | Path | None = None) -> Path:
        """Persist the entries recorded since the last write, in O(new entries).

        Appends them to a journal beside the snapshot (``ledger.json.journal``,
        one JSON line per entry with its sequence number and chain hash,
        fsynced), so a long run does not rewrite its whole history every
        round; :meth:`save` compacts. A last line cut short by a crash is
        skipped on load: that round was never checkpointed and runs (and is
        charged) once more on resume.
        """
        target = self._target(path)
        if not target.exists() or self._persisted == 0 or self._compact:
            return self.save(target)
        entries, chains = self._all()
        if len(entries) > self._persisted:
            with _journal(target).open("a") as fh:
                for seq in range(self._persisted, len(entries)):
                    entry = entries[seq]
                    line = json.dumps(
                        {
                            "seq": seq,
                            **entry.to_json(),
                            "chain": chains[seq],
                            "digest": entry.digest,
                        }
                    )
                    half = len(line) // 2
                    fh.write(line[:half])
                    fh.flush()
                    fault("ledger-journal")  # crash tests: die mid-line
                    fh.write(line[half:] + "\n")
                fh.flush()
                os.fsync(fh.fileno())
            self._persisted = len(entries)
        return target

    def _target(self, path: str | Path | None) -> Path:
        target = Path(path) if path is not None else self.path
        if target is None:
            raise DpflError("save needs a path: the ledger was created without one")
        return target

    @classmethod
    def load(cls, path: str | Path) -> PrivacyLedger:
        """Read a ledger written by :meth:`save` (or :meth:`flush`), checking it.

        The ledger comes back with the guard its file names in ``"guard"``
        (a registered :class:`Guard`), so a run resumed from it keeps its stop
        rule. The hash chain is
        recomputed over the snapshot and the journal; the one thing forgiven
        is a torn *last* journal line (a crash mid-append).

        Raises
        ------
        DpflError
            If the file is missing, is not a dpfl ledger, names a guard that
            is not registered, or fails its checksums
            (an entry, the header or the count changed, a journal line
            corrupted, missing or out of sequence).
        """
        p = Path(path)
        try:
            data = json.loads(p.read_text())
        except FileNotFoundError:
            raise DpflError(f"ledger file not found: {p}") from None
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise DpflError(
                f"ledger file {p} is not valid JSON ({exc}): it was cut short or "
                "corrupted; refusing to resume without it (the spend is never reset)"
            ) from None
        if not isinstance(data, dict) or data.get("format") != _FORMAT:
            raise DpflError(f"{p} is not a dpfl ledger (format {_FORMAT})")
        try:
            budget = data.get("budget")
            try:
                guard = _guard_named(str(data.get("guard", Guard.name)))
            except InvalidParameterError as exc:
                raise DpflError(f"{p}: {exc}") from None
            ledger = cls(
                None if budget is None else Budget(**budget),
                analysis=data.get("analysis"),
                path=p,
                tolerance=float(data.get("tolerance", 0.02)),
                run=data.get("run"),
                key=data.get("key"),
                guard=guard,
            )
            items = list(data.get("entries", []))
            digests = list(data.get("digests") or [None] * len(items))
            if len(digests) != len(items):
                raise DpflError(
                    f"{p} holds {len(digests)} digests for {len(items)} entries"
                )
            for i, (item, released) in enumerate(zip(items, digests, strict=True)):
                ledger._read(item, f"{p} entry {i + 1}", released)
            if data.get("count") != len(items) or data.get("head") != ledger.chain_at(
                len(items)
            ):
                raise DpflError(
                    f"{p} fails its checksum (count or head of the chain): entries "
                    "were removed or the header was changed"
                )
            journal = _journal(p)
            if journal.exists():
                ledger._read_journal(journal, len(items))
        except DpflError:
            raise
        except (TypeError, ValueError, KeyError, AttributeError) as exc:
            raise DpflError(f"{p} is not a valid dpfl ledger: {exc}") from None
        ledger._persisted = ledger.released
        return ledger

    def _read(self, item: Any, where: str, released: Any = None) -> None:
        """Append one stored entry after checking its chain hash."""
        if not isinstance(item, dict):
            raise DpflError(f"{where} is not an entry")
        item = dict(item)
        chain = item.pop("chain", None)
        released = item.pop("digest", released)
        entry = dataclasses.replace(
            LedgerEntry.from_json(item),
            digest=None if released is None else str(released),
        )
        self._append(entry)
        if self._chain[-1] != chain:
            raise DpflError(
                f"{where} (round {entry.round + 1}) fails its checksum: the ledger "
                "was altered or corrupted; refusing it (the spend is never reset)"
            )

    def _read_journal(self, journal: Path, snapshot: int) -> None:
        lines = journal.read_text().split("\n")
        if lines and lines[-1] == "":
            lines.pop()
        for i, line in enumerate(lines):
            where = f"{journal} line {i + 1}"
            try:
                item = json.loads(line)
            except json.JSONDecodeError:
                if i == len(lines) - 1:
                    break  # the last line cut short by a crash: that round re-runs
                raise DpflError(
                    f"{where} is corrupted (not JSON) with lines after it; refusing "
                    "the ledger"
                ) from None
            if not isinstance(item, dict) or not isinstance(item.get("seq"), int):
                raise DpflError(f"{where} is not a journal entry")
            seq = item.pop("seq")
            count = len(self._entries)
            if seq < snapshot and seq < count:
                # left by a crash between a compaction and the journal's removal
                if item.get("chain") != self._chain[seq]:
                    raise DpflError(
                        f"{where} disagrees with entry {seq + 1} of the snapshot"
                    )
                continue
            if seq != count:
                raise DpflError(
                    f"{where} holds entry {seq + 1} where entry {count + 1} is due: "
                    "the journal has a gap; refusing the ledger (its spend would be "
                    "lower than what was charged)"
                )
            self._read(item, where)
        self._compact = True  # the next flush rewrites the snapshot
