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

The record itself (the entries, their hash chain, their replay after a
resume and the files on disk) is :class:`~dpfl.accounting.chain.EntryChain`,
which the ledger extends; who has been charged what is kept, incrementally,
by :class:`~dpfl.accounting.spend.Spend`.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any, ClassVar

from dpfl._files import digest as _digest
from dpfl._validate import check_delta, check_positive
from dpfl.accounting import costs, gaussian, schemes
from dpfl.accounting import events as ev
from dpfl.accounting.accountant import Accountant, composed_epsilon
from dpfl.accounting.bounds import Bound
from dpfl.accounting.chain import LEDGER_FORMAT, EntryChain, LedgerEntry, read_file
from dpfl.accounting.pricing import canonical
from dpfl.accounting.spend import Profile, Spend, gaussian_mu2, profile_of
from dpfl.errors import (
    BudgetExceededError,
    DpflError,
    InvalidParameterError,
)

__all__ = [
    "Budget",
    "Guard",
    "PrivacyLedger",
    "guard_names",
    "register_guard",
]


@dataclasses.dataclass(frozen=True)
class Budget:
    """A total (ε, δ) budget for a run."""

    epsilon: float
    delta: float

    def __post_init__(self) -> None:
        check_positive("budget epsilon", self.epsilon, allow_inf=True)
        check_delta("budget delta", self.delta)


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


class PrivacyLedger(EntryChain):
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
        super().__init__(path)
        self.tolerance = tolerance
        self.run = run
        self.key = key
        # per event: (largest count known to fit, smallest count known not to)
        self._known: dict[ev.Event, tuple[int, float]] = {}
        self._spend: dict[str | None, Spend] = {}
        self._priced: dict[tuple[str | None, Profile, float], Bound] = {}
        self._mu2_cap: float | None = None  # largest Gaussian mu^2 in budget

    def _header(self) -> dict[str, Any]:
        return {
            "guard": self.guard,
            "analysis": self.analysis,
            "budget": None if self.budget is None else dataclasses.asdict(self.budget),
            "tolerance": self.tolerance,
            "run": self.run,
            "key": self.key,
        }

    # -- recording ------------------------------------------------------------
    def rewind(self, count: int) -> None:
        """As :meth:`~dpfl.accounting.chain.EntryChain.rewind`.

        The spend is then recomputed from the confirmed entries.
        """
        super().rewind(count)
        self._spend.clear()

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

    def _summary(self, analysis: str | None) -> Spend:
        """Who has been charged what under ``analysis``, brought up to date."""
        spend = self._spend.get(analysis) or Spend(analysis)
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
        key = (analysis, profile_of(charges), delta)
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
        mu2 = gaussian_mu2(charges)
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
            "format": LEDGER_FORMAT,
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
        data = read_file(p)
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
            ledger._restore(data, p)
        except DpflError:
            raise
        except (TypeError, ValueError, KeyError, AttributeError) as exc:
            raise DpflError(f"{p} is not a valid dpfl ledger: {exc}") from None
        return ledger
