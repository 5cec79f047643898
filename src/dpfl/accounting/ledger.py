"""The privacy ledger: what a run has spent, persisted atomically, with a guard.

A :class:`PrivacyLedger` records each round's event (the same value the sampler
realised) and, for schemes whose guarantee depends on who took part, the
clients that took part. It answers the spend so far as a bound, each client's
own spend, and refuses (raises :class:`~dpfl.errors.BudgetExceededError`)
a round that would take the run past its budget, *before* the round runs.

The JSON file on disk is the truth: :meth:`PrivacyLedger.save` writes a
temporary file and renames it over the old one (atomic on POSIX), and
:meth:`PrivacyLedger.load` restores the exact spend of a stopped run.
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

from dpfl.accounting import events as ev
from dpfl.accounting import rdp
from dpfl.accounting._checks import check_delta, check_positive
from dpfl.accounting.accountant import Accountant, canonical
from dpfl.accounting.bounds import Bound
from dpfl.errors import (
    BudgetExceededError,
    DpflError,
    InvalidParameterError,
    UnsupportedEventError,
)

__all__ = [
    "GUARDS",
    "Budget",
    "LedgerEntry",
    "MomentsAccountantLedger",
    "PrivacyLedger",
    "ledger_class",
]

_FORMAT = 1


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
    """

    round: int
    event: ev.Event
    participants: tuple[int, ...] | None = None
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)

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


def _journal(path: Path) -> Path:
    return path.with_name(path.name + ".journal")


def _prices_client_sampling(event: ev.Event) -> bool:
    """Whether an event's price already includes who takes part (all clients pay)."""
    if isinstance(event, ev.SelfComposed):
        return _prices_client_sampling(event.event)
    return isinstance(event, ev.ClientPoisson | ev.FixedCohort | ev.TwoStage)


@dataclasses.dataclass
class _GuardSummary:
    """What the budget guard needs of the recorded rounds, kept incrementally.

    :meth:`update` reads only the entries appended since its last call, so the
    guard costs O(1) amortised per round instead of a pass over the history.
    """

    seen: int = 0
    first: ev.Event | None = None  # canonical event of the first round
    homogeneous: bool = True  # every round's canonical event equals ``first``
    every_round_counts: bool = False  # a round names no one or prices sampling
    counts: Counter[int] = dataclasses.field(default_factory=Counter)

    def update(self, entries: Sequence[LedgerEntry]) -> _GuardSummary:
        if len(entries) < self.seen:  # the history was replaced: start over
            return _GuardSummary().update(entries)
        for entry in entries[self.seen :]:
            event = canonical(entry.event)
            if self.first is None:
                self.first = event
            elif event != self.first:
                self.homogeneous = False
            if entry.participants is None or _prices_client_sampling(entry.event):
                self.every_round_counts = True
            else:
                self.counts.update(set(entry.participants))
        self.seen = len(entries)
        return self

    def rounds_of(self, event: ev.Event) -> int | None:
        """Rounds of (canonical) ``event`` the guard counts, or ``None``.

        As :meth:`PrivacyLedger._guarded_history` counts them; ``None`` when
        that history holds another event (the guard then composes it in full).
        """
        if self.first is None:
            return 0
        same = self.homogeneous and self.first == event
        if self.every_round_counts:
            return self.seen if same else None
        if not self.counts:
            return 0  # no client has taken part: nothing to guard
        return max(self.counts.values()) if same else None


class PrivacyLedger:
    """Per-run record of privacy events, with a budget guard.

    Parameters
    ----------
    budget : Budget or None
        The run's total (ε, δ); ``None`` records without a guard.
    analysis : str
        The analysis used to price events (``"sound"`` by default).
    path : str or Path or None
        Where :meth:`save` writes; ``None`` keeps the ledger in memory.
    tolerance : float
        Relative bracket width passed to the :class:`Accountant`.
    """

    #: Name of the budget guard, saved with the ledger so that
    #: :meth:`load` restores the same stop rule (see :data:`GUARDS`).
    guard: ClassVar[str] = "accountant"

    def __init__(
        self,
        budget: Budget | None = None,
        *,
        analysis: str = "sound",
        path: str | Path | None = None,
        tolerance: float = 0.02,
    ) -> None:
        self.budget = budget
        self.analysis = analysis
        self.path = None if path is None else Path(path)
        self.tolerance = tolerance
        self._entries: list[LedgerEntry] = []
        # per event: (largest count known to fit, smallest count known not to)
        self._known: dict[ev.Event, tuple[int, float]] = {}
        self._persisted = 0  # entries already on disk (snapshot + journal)
        self._summary = _GuardSummary()

    # -- recording ------------------------------------------------------------
    @property
    def entries(self) -> list[LedgerEntry]:
        """The recorded rounds, in order."""
        return list(self._entries)

    @property
    def rounds(self) -> int:
        """Number of recorded rounds."""
        return len(self._entries)

    def record(
        self,
        event: ev.Event,
        *,
        participants: Iterable[int] | None = None,
        round: int | None = None,
        extra: dict[str, Any] | None = None,
    ) -> LedgerEntry:
        """Record one round's event (after checking the budget); returns the entry.

        Raises
        ------
        BudgetExceededError
            If recording ``event`` would exceed the budget; nothing is recorded.
        """
        self.check(event)
        entry = LedgerEntry(
            round=self.rounds if round is None else int(round),
            event=event,
            participants=None
            if participants is None
            else tuple(int(k) for k in participants),
            extra=dict(extra or {}),
        )
        self._entries.append(entry)
        return entry

    # -- queries --------------------------------------------------------------
    def accountant(
        self, events: Iterable[ev.Event] | None = None, *, analysis: str | None = None
    ) -> Accountant:
        """An :class:`Accountant` holding ``events`` (default: every recorded one).

        ``analysis`` overrides the ledger's analysis (e.g. to report a paper's
        bound beside the sound one).
        """
        acc = Accountant(analysis or self.analysis, tolerance=self.tolerance)
        for e in self._events() if events is None else events:
            acc.compose(e)
        return acc

    def _events(self) -> list[ev.Event]:
        return [e.event for e in self._entries]

    def epsilon(
        self, delta: float | None = None, *, analysis: str | None = None
    ) -> Bound:
        """ε spent so far at ``delta`` (default: the budget's δ).

        When every round names its participants and its event prices one
        participant's release (per-client accounting: check-in, local steps),
        this is the spend of the client that took part most often (exact for
        a run of identical events; every round is counted otherwise).
        """
        events = self._guarded_history()
        return self.accountant(events, analysis=analysis).epsilon(self._delta(delta))

    def _delta(self, delta: float | None) -> float:
        if delta is not None:
            return delta
        if self.budget is None:
            raise DpflError("delta must be given when the ledger has no budget")
        return self.budget.delta

    def client_rounds(self, client: int) -> int:
        """Rounds in which ``client`` is recorded as a participant."""
        return sum(
            1
            for e in self._entries
            if e.participants is not None and client in e.participants
        )

    def client_epsilon(self, client: int, delta: float | None = None) -> Bound:
        """ε of one client: the composition of the rounds it took part in.

        Rounds recorded without participants count for every client (their
        event already prices the sampling).
        """
        chosen = [
            e.event
            for e in self._entries
            if e.participants is None or client in e.participants
        ]
        return self.accountant(chosen).epsilon(self._delta(delta))

    # -- the guard ------------------------------------------------------------
    def check(self, event: ev.Event) -> None:
        """Raise :class:`BudgetExceededError` if adding ``event`` exceeds the budget.

        When every recorded round names its participants (per-client
        accounting: check-in, two-stage schemes), the guard protects the
        client that has spent most, assuming it takes part in the next round
        too; otherwise every round counts for everyone.
        """
        if self.budget is None or math.isinf(self.budget.epsilon):
            return
        event = canonical(event)
        count = self._history_summary().rounds_of(event)
        if count is not None:
            # Homogeneous run (the common case): find once how many rounds of
            # this event the budget allows, then compare counts (O(1) a round).
            if self._fits(event, count + 1):
                return
        else:
            history = self._guarded_history()
            bound = self.accountant([*history, event]).epsilon(self.budget.delta)
            if bound.upper <= self.budget.epsilon:
                return
        raise BudgetExceededError(
            f"round {self.rounds + 1} would exceed the budget "
            f"(epsilon={self.budget.epsilon}, delta={self.budget.delta}) under the "
            f"{self.analysis!r} analysis; stopped before it ({self.rounds} rounds "
            "spent)"
        )

    def _history_summary(self) -> _GuardSummary:
        """The guard's summary of the recorded rounds, brought up to date."""
        self._summary = self._summary.update(self._entries)
        return self._summary

    def _guarded_history(self) -> list[ev.Event]:
        """Events the guard must count: every round, or the worst client's rounds."""
        if (
            not self._entries
            or any(e.participants is None for e in self._entries)
            or any(_prices_client_sampling(e.event) for e in self._entries)
        ):
            # An event that prices the sampling of clients (ClientPoisson,
            # FixedCohort, TwoStage) holds for every client in every round.
            return self._events()
        # Rounds per client (a client named twice in one round took part once).
        counts = Counter(k for e in self._entries for k in set(e.participants or ()))
        if not counts:
            return []
        worst = max(counts, key=lambda k: counts[k])
        chosen = [
            canonical(e.event) for e in self._entries if worst in (e.participants or ())
        ]
        if all(canonical(e.event) == chosen[0] for e in self._entries):
            return chosen  # homogeneous: the most frequent client is the worst
        return self._events()  # heterogeneous: count every round (conservative)

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
        acc = Accountant(self.analysis, tolerance=self.tolerance).compose(event, count)
        return acc.epsilon(self.budget.delta).upper  # type: ignore[union-attr]

    def max_rounds(self, event: ev.Event, limit: int = 1_000_000) -> int:
        """Largest T <= ``limit`` with T rounds of ``event`` within the budget."""
        if self.budget is None or math.isinf(self.budget.epsilon):
            return limit
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

    # -- persistence ----------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        """Return the ledger as a JSON-ready dict."""
        return {
            "format": _FORMAT,
            "guard": self.guard,
            "analysis": self.analysis,
            "tolerance": self.tolerance,
            "budget": None if self.budget is None else dataclasses.asdict(self.budget),
            "entries": [e.to_json() for e in self._entries],
        }

    def save(self, path: str | Path | None = None) -> Path:
        """Write the whole ledger atomically (temporary file, fsync, rename).

        The snapshot holds every entry, so the journal of :meth:`flush` is
        removed afterwards (entries it still holds are ignored on load).
        """
        target = self._target(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
        try:
            with os.fdopen(fd, "w") as fh:
                json.dump(self.to_json(), fh, indent=1)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, target)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
        _journal(target).unlink(missing_ok=True)
        self._persisted = len(self._entries)
        return target

    def flush(self, path: str | Path | None = None) -> Path:
        """Persist the entries recorded since the last write, in O(new entries).

        Appends them to a journal beside the snapshot (``ledger.json.journal``,
        one JSON line per entry with its sequence number, fsynced), so a long
        run does not rewrite its whole history every round; :meth:`save`
        compacts. A line cut short by a crash is ignored on load: that round
        was never checkpointed either and is re-run (and charged) on resume.
        """
        target = self._target(path)
        if not target.exists() or self._persisted == 0:
            return self.save(target)
        new = self._entries[self._persisted :]
        if new:
            with _journal(target).open("a") as fh:
                for seq, entry in enumerate(new, start=self._persisted):
                    fh.write(json.dumps({"seq": seq, **entry.to_json()}) + "\n")
                fh.flush()
                os.fsync(fh.fileno())
            self._persisted = len(self._entries)
        return target

    def _target(self, path: str | Path | None) -> Path:
        target = Path(path) if path is not None else self.path
        if target is None:
            raise DpflError("save needs a path: the ledger was created without one")
        return target

    @classmethod
    def load(cls, path: str | Path) -> PrivacyLedger:
        """Read a ledger written by :meth:`save` (or :meth:`flush`).

        The ledger comes back as the class its file names in ``"guard"``
        (files without it: :class:`PrivacyLedger`), so a run resumed from it
        keeps its stop rule.

        Raises
        ------
        DpflError
            If the file is missing or not a dpfl ledger, or names a guard that
            is not ``cls`` or one of its subclasses.
        """
        p = Path(path)
        try:
            data = json.loads(p.read_text())
        except FileNotFoundError:
            raise DpflError(f"ledger file not found: {p}") from None
        except json.JSONDecodeError as exc:
            raise DpflError(f"ledger file {p} is not valid JSON: {exc}") from None
        if not isinstance(data, dict) or data.get("format") != _FORMAT:
            raise DpflError(f"{p} is not a dpfl ledger (format {_FORMAT})")
        budget = data.get("budget")
        kind = ledger_class(str(data.get("guard", PrivacyLedger.guard)))
        if not issubclass(kind, cls):
            raise DpflError(
                f"{p} holds a ledger with the {kind.guard!r} guard; load it with "
                f"{kind.__name__}.load or PrivacyLedger.load"
            )
        ledger = kind(
            None if budget is None else Budget(**budget),
            analysis=data.get("analysis", "sound"),
            path=p,
            tolerance=float(data.get("tolerance", 0.02)),
        )
        ledger._entries = [LedgerEntry.from_json(e) for e in data.get("entries", [])]
        ledger._persisted = len(ledger._entries)
        journal = _journal(p)
        if journal.exists():
            for line in journal.read_text().splitlines():
                try:
                    item = json.loads(line)
                except json.JSONDecodeError:
                    break  # a line cut short by a crash: that round is re-run
                if int(item.pop("seq")) == len(ledger._entries):
                    ledger._entries.append(LedgerEntry.from_json(item))
            ledger._persisted = 0  # the next flush compacts into the snapshot
        return ledger


class MomentsAccountantLedger(PrivacyLedger):
    """A ledger whose guard is Geyer et al.'s moments accountant (RDP).

    The guard refuses the round after which ``δ(ε) > Q`` where δ is computed by
    :func:`dpfl.accounting.rdp.dp_fedavg_delta` with ``analysis="paper"``:
    RDP of the Poisson-subsampled Gaussian at ``q_t = m_t/K`` composed over the
    rounds (heterogeneous m_t, σ_t) and converted to (ε, δ). So a run with this
    ledger stops exactly where :func:`dpfl.accounting.rdp.dp_fedavg_stop_round`
    (``analysis="paper"``) says, i.e. where the paper's Algorithm 1 stops.

    The Poisson reading is not valid for fixed-size cohorts (SPEC §4.3 item 1);
    use :class:`PrivacyLedger` with ``analysis="sound"`` for a defensible
    guarantee. :meth:`epsilon` reports the Accountant's ``"paper"`` reading
    (tight PLD, smaller than the RDP bound). The saved file names this guard
    (``"guard": "moments-accountant"``), so :meth:`PrivacyLedger.load` gives
    back a ledger of this class, which stops where the original would have.

    Parameters
    ----------
    budget : Budget
        ``Budget(epsilon=ε, delta=Q)`` (the paper: ε = 8, Q = 1e-3 for K = 100).
    analysis : str
        Stored for :meth:`epsilon`; default ``"paper"``.
    path : str or Path or None
        Where :meth:`save` writes.
    tolerance : float
        Passed to the :class:`~dpfl.accounting.accountant.Accountant`.

    References
    ----------
    Geyer, Klein & Nabi (2017), Algorithm 1 lines 4-5; Abadi et al. (2016),
    Theorem 2; SPEC.md §4.2.
    """

    guard: ClassVar[str] = "moments-accountant"

    def __init__(
        self,
        budget: Budget | None = None,
        *,
        analysis: str = "paper",
        path: str | Path | None = None,
        tolerance: float = 0.02,
    ) -> None:
        super().__init__(budget, analysis=analysis, path=path, tolerance=tolerance)

    @staticmethod
    def _round(event: ev.Event) -> tuple[int, int, float]:
        if not (
            isinstance(event, ev.FixedCohort)
            and isinstance(event.event, ev.Gaussian)
            and event.event.sensitivity == 1.0
        ):
            raise UnsupportedEventError(
                "the moments-accountant guard prices FixedCohort(m, K, "
                f"Gaussian(sigma)) rounds only; got {event!r}"
            )
        return event.population, event.cohort_size, event.event.noise_multiplier

    def moments_delta(self, epsilon: float, events: Sequence[ev.Event]) -> float:
        """δ(ε) of ``events`` under the paper's moments accountant.

        Parameters
        ----------
        epsilon : float
            ε >= 0.
        events : sequence of Event
            FixedCohort rounds with one population K.

        Returns
        -------
        float
            δ (0 for no events).

        Raises
        ------
        dpfl.errors.UnsupportedEventError
            If an event is not ``FixedCohort(m, K, Gaussian(σ))``.
        dpfl.errors.InvalidParameterError
            If the rounds have different populations K.
        """
        if not events:
            return 0.0
        rounds = [self._round(e) for e in events]
        populations = {k for k, _, _ in rounds}
        if len(populations) != 1:
            raise InvalidParameterError(
                f"all rounds must share one population K; got {sorted(populations)}"
            )
        return rdp.dp_fedavg_delta(
            epsilon=epsilon,
            clients=populations.pop(),
            cohort_sizes=[m for _, m, _ in rounds],
            noise_multipliers=[z for _, _, z in rounds],
            analysis="paper",
        )

    def check(self, event: ev.Event) -> None:
        """Raise if recording ``event`` would make the moments-accountant δ exceed Q.

        Parameters
        ----------
        event : Event
            The next round's event.

        Raises
        ------
        dpfl.errors.BudgetExceededError
            If ``δ(ε)`` after the round exceeds ``budget.delta``.
        """
        if self.budget is None or math.isinf(self.budget.epsilon):
            return
        k, m, z = self._round(event)
        summary = self._history_summary()
        if summary.homogeneous and summary.first in (None, canonical(event)):
            # Every round so far is this one (the common case): δ of T + 1
            # identical rounds, without a pass over the history.
            delta = rdp.dp_fedavg_delta(
                epsilon=self.budget.epsilon,
                clients=k,
                cohort_sizes=m,
                noise_multipliers=z,
                rounds=self.rounds + 1,
                analysis="paper",
            )
        else:
            history = [e.event for e in self._entries]
            delta = self.moments_delta(self.budget.epsilon, [*history, event])
        if delta > self.budget.delta:
            raise BudgetExceededError(
                f"round {self.rounds + 1} would give delta={delta:.4g} > "
                f"Q={self.budget.delta} at epsilon={self.budget.epsilon} "
                "(moments accountant, Poisson reading of the cohort); stopped "
                f"before it ({self.rounds} rounds spent)"
            )


#: The ledgers by the name of their guard (``privacy.guard`` in a run config).
GUARDS: dict[str, type[PrivacyLedger]] = {
    PrivacyLedger.guard: PrivacyLedger,
    MomentsAccountantLedger.guard: MomentsAccountantLedger,
}


def ledger_class(guard: str) -> type[PrivacyLedger]:
    """The ledger class whose budget guard is named ``guard``.

    Parameters
    ----------
    guard : str
        ``"accountant"`` (the Accountant's bound under the ledger's analysis)
        or ``"moments-accountant"`` (DP-FedAvg's RDP stop rule).

    Returns
    -------
    type
        :class:`PrivacyLedger` or a subclass.

    Raises
    ------
    dpfl.errors.InvalidParameterError
        For an unknown name.
    """
    try:
        return GUARDS[guard]
    except KeyError:
        raise InvalidParameterError(
            f"guard must be one of {sorted(GUARDS)}; got {guard!r}"
        ) from None
