"""What each event's guarantee means: its terms, its analyses and their status.

Every event type belongs to a *scheme* (random participation, a fixed cohort,
check-in, ...). A scheme states the guarantee's **terms** (the privacy unit,
the neighbouring relation, the adversary) and the **analyses** that can price
it, each with its **status**:

``"proven"``
    A valid upper bound, with the published result it rests on.
``"numerically-supported"``
    Rests on a condition that is checked numerically but not proven.
``"open"``
    Rests on a condition that is neither proven nor fully supported: the
    number is not known to be an upper bound.
``"invalid"``
    Not a valid worst-case bound (a paper's own reading, or a reference);
    reported for comparison, labelled, beside a proven one.

Each scheme's *default* is its tightest proven analysis. Where an analysis
changes the terms (e.g. a paper that reads a fixed cohort as Poisson
sampling), it says so. :func:`describe` gives the whole statement for an
event; ``dpfl account``, ``dpfl calibrate`` and run reports print it.

The sensitivity convention (stated once): a :class:`~dpfl.accounting.events.Gaussian`
event's ``sensitivity`` is the norm bound of one unit's clipped contribution,
in units of the clip (1 for a clipped record or client update). Under
add/remove that is the sum's sensitivity. Events whose neighbouring relation
is *replace-one* (:class:`~dpfl.accounting.events.WithoutReplacement`,
:class:`~dpfl.accounting.events.FixedCohort` under ``"sound"``,
:class:`~dpfl.accounting.events.CheckIn`) double it themselves, because a
replaced contribution moves the sum by up to twice its norm: never pass 2 for
replace-one.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Literal

from dpfl.accounting import events as ev
from dpfl.errors import InvalidParameterError, UnsupportedEventError

__all__ = [
    "STATUSES",
    "Analysis",
    "Scheme",
    "all_analyses",
    "analysis_of",
    "describe",
    "resolve_analysis",
    "scheme_of",
]

Status = Literal["proven", "numerically-supported", "open", "invalid"]
STATUSES: tuple[Status, ...] = ("proven", "numerically-supported", "open", "invalid")


@dataclasses.dataclass(frozen=True)
class Analysis:
    """One way of pricing a scheme, and how far it can be trusted.

    Attributes
    ----------
    name : str
        The name users pass (``analysis="wcs"``).
    status : str
        One of :data:`STATUSES`.
    basis : str
        What the number rests on (theorem and reference, or why it is not a
        bound).
    adversary : str or None
        The adversary, when the analysis assumes another one than its scheme.
    neighbouring : str or None
        The neighbouring relation, when the analysis assumes another one.
    """

    name: str
    status: Status
    basis: str
    adversary: str | None = None
    neighbouring: str | None = None

    @property
    def valid(self) -> bool:
        """Whether the analysis is a proven upper bound."""
        return self.status == "proven"


@dataclasses.dataclass(frozen=True)
class Scheme:
    """A family of events with one meaning, and the analyses that price it.

    Attributes
    ----------
    name : str
        Human-readable name (``"random participation"``).
    unit : str
        ``"record"``, ``"client"``, or a description for generic events.
    neighbouring : str
        The neighbouring relation.
    adversary : str
        Who sees what.
    analyses : tuple of Analysis
        Every analysis offered, the default first.
    per_participant : tuple of str
        Analyses under which a run charges each unit only for the rounds it
        took part in (the adversary sees who took part, so a round costs a
        non-participant nothing); the ledger then tracks each unit's spend,
        at the costs of :mod:`dpfl.accounting.costs`.
    guards : tuple of (str, str)
        Budget guards other than the Accountant's that can stop a run of this
        scheme (a paper's own stop rule, :mod:`dpfl.accounting.guards`), each
        with the analysis it applies. Every scheme accepts ``"accountant"``.
    """

    name: str
    unit: str
    neighbouring: str
    adversary: str
    analyses: tuple[Analysis, ...]
    per_participant: tuple[str, ...] = ()
    guards: tuple[tuple[str, str], ...] = ()

    def guard_analysis(self, guard: str) -> str:
        """The analysis the guard named ``guard`` applies to this scheme.

        Raises
        ------
        UnsupportedEventError
            If the scheme offers no such guard (the message lists those it
            offers).
        """
        for name, analysis in self.guards:
            if name == guard:
                return analysis
        raise UnsupportedEventError(
            f"guard must be one of {['accountant', *(g for g, _ in self.guards)]} "
            f"for {self.name}; got {guard!r}"
        )

    @property
    def default(self) -> str:
        """The tightest proven analysis (listed first)."""
        return self.analyses[0].name

    def analysis(self, name: str | None) -> Analysis:
        """The analysis called ``name`` (``None``: the default).

        Raises
        ------
        UnsupportedEventError
            If the scheme offers no analysis of that name (the message lists
            the ones it offers).
        """
        if name is None:
            return self.analyses[0]
        for a in self.analyses:
            if a.name == name:
                return a
        raise UnsupportedEventError(
            f"analysis must be one of {[a.name for a in self.analyses]} for "
            f"{self.name}; got {name!r}"
        )


# -- the schemes -------------------------------------------------------------------
_EXACT_GAUSSIAN = Analysis(
    "exact",
    "proven",
    "exact privacy-loss distribution of the Gaussian mechanism (Balle & Wang "
    "2018, Thm 8; Dong, Roth & Su 2022), composed with certified PLD bounds",
)

GAUSSIAN = Scheme(
    "Gaussian mechanism",
    unit="one clipped contribution (the record or client whose data is clipped)",
    neighbouring="add/remove of that contribution",
    adversary="sees every noisy output",
    analyses=(_EXACT_GAUSSIAN,),
)

POISSON_SAMPLED = Scheme(
    "Poisson-subsampled Gaussian",
    unit="one clipped contribution (the record or client whose data is clipped)",
    neighbouring="add/remove of that contribution",
    adversary="sees every noisy output, not who was sampled",
    analyses=(
        Analysis(
            "exact",
            "proven",
            "tight privacy-loss distribution of the Poisson-subsampled Gaussian "
            "(Zhu, Dong & Wang 2022; Doroshenko et al. 2022), both directions",
        ),
    ),
)

RECORD_POISSON = Scheme(
    "DP-SGD with Poisson record sampling",
    unit="record",
    neighbouring="add/remove of one record",
    adversary="sees each round's noisy aggregate, not which records were sampled",
    analyses=POISSON_SAMPLED.analyses,
)

CLIENT_POISSON = Scheme(
    "client-level Poisson sampling (DP-FedAvg with Poisson clients)",
    unit="client",
    neighbouring="add/remove of one client's data",
    adversary="sees every released model update (noise added by a trusted "
    "server), not who took part",
    analyses=POISSON_SAMPLED.analyses,
)

_RP_HIDDEN = "sees each round's noisy aggregate, not who took part (trusted server)"

RANDOM_PARTICIPATION = Scheme(
    "random participation (Hasircioglu & Gunduz)",
    unit="record",
    neighbouring="add/remove of one record",
    adversary=_RP_HIDDEN,
    analyses=(
        Analysis(
            "sound",
            "proven",
            "the two-sided conditional pair: the set of the client's other "
            "records that would be sampled is revealed (a relaxation by joint "
            "convexity); per number i of such records, the aligned pair (means "
            "0, i, i+1) is the exact worst case in the remove direction and the "
            "anti-aligned pair (0, i, i-1) in the add direction, by a "
            "supermodularity lemma (Tchen 1980; Muller & Scarsini 2000) and a "
            "monotone-likelihood-ratio lemma; their pointwise maximum, mixed "
            "over Binomial(d, q) and discretised by connect-the-dots (Doroshenko "
            "et al. 2022), is a dominating pair that composes adaptively (Zhu, "
            "Dong & Wang 2022)",
        ),
        Analysis(
            "wcs",
            "proven",
            "participation treated as visible: each round is, w.p. p, a "
            "Poisson(q)-subsampled Gaussian and otherwise nothing (Theorem 5.2 "
            "of Hasircioglu & Gunduz, arXiv 2205.01556, composed as a PLD); "
            "valid for every gradient configuration, no lemma needed; looser "
            "than 'sound'",
            adversary="sees each round's noisy aggregate and who took part",
        ),
        Analysis(
            "ols",
            "proven",
            "ignores client sampling (every client takes part, p = 1): a "
            "Poisson(q)-subsampled Gaussian per round (Theorem 5.1); valid, loose",
        ),
        Analysis(
            "paper",
            "invalid",
            "Theorem 4.1 as printed: assumes the client's other sampled records "
            "have full-norm gradients collinear with the target's, which hides "
            "it; zero or angled companion gradients leak more",
        ),
        Analysis(
            "cs",
            "invalid",
            "central-shuffling reference (Corollary 5.3): the Poisson-subsampled "
            "Gaussian at rate p*q, which zero companion gradients attain; a "
            "lower bound on the worst case, not an upper bound",
        ),
    ),
)

_POISSON_READING = "add/remove of one client's data (as if Poisson-sampled)"

FIXED_COHORT = Scheme(
    "fixed-size cohort (client-level DP-FedAvg, Geyer et al.)",
    unit="client",
    neighbouring="replace-one client's data (cohort size is public)",
    adversary="sees every released global model (noise added by a trusted server)",
    analyses=(
        Analysis(
            "sound",
            "proven",
            "uniform sampling without replacement under replace-one: each round "
            "is C_{m/K}(G_{2/sigma}) (Dong, Roth & Su 2022, subsampling "
            "theorem), symmetrised and composed as a PLD",
        ),
        Analysis(
            "sound-rdp",
            "proven",
            "the same scheme with the RDP bound for sampling without replacement "
            "(Wang, Balle & Kasiviswanathan 2019) and the improved RDP-to-DP "
            "conversion (Balle et al. 2020); valid, looser than 'sound'",
        ),
        Analysis(
            "paper",
            "invalid",
            "the paper's moments accountant (Abadi et al. 2016): the cohort read "
            "as Poisson sampling at rate m/K under add/remove, RDP at integer "
            "moments 1..32 converted by delta = min exp(alpha(l) - l eps); not "
            "valid for a fixed-size cohort",
            neighbouring=_POISSON_READING,
        ),
        Analysis(
            "paper-rdp",
            "invalid",
            "the paper's Poisson reading with the improved RDP-to-DP conversion "
            "(Balle et al. 2020); not valid for a fixed-size cohort",
            neighbouring=_POISSON_READING,
        ),
        Analysis(
            "paper-pld",
            "invalid",
            "the paper's Poisson reading with a tight PLD; not valid for a "
            "fixed-size cohort (valid only if clients are Poisson-sampled)",
            neighbouring=_POISSON_READING,
        ),
    ),
    # Geyer et al.'s stop rule (Abadi et al.'s conversion), and the same
    # accountant with the improved conversion.
    guards=(("moments-accountant", "paper"), ("rdp", "paper-rdp")),
)

WITHOUT_REPLACEMENT = Scheme(
    "sampling without replacement (noisy SGD steps on a uniform batch)",
    unit="record",
    neighbouring="replace-one record (dataset size is public)",
    adversary="sees every noisy step",
    analyses=(
        Analysis(
            "exact",
            "proven",
            "C_{B/n}(G_mu) of Dong, Roth & Su (2022) (subsampling theorem under "
            "replace-one), symmetrised before composition, as a PLD",
        ),
    ),
)

_SERVER_SEES = "the server: sees every participant's noisy release and who took part"

CHECK_IN = Scheme(
    "random check-in (MS-PAFL; PriFedSync's client sync)",
    unit="record",
    neighbouring="replace-one record (the dataset size is public)",
    adversary=_SERVER_SEES + " (and so anyone who sees less)",
    analyses=(
        Analysis(
            "sound",
            "proven",
            "participation visible: a round costs a client its full release if "
            "it took part and nothing otherwise; before a run, each round is the "
            "public-label mixture (w.p. p the release, else nothing) composed as "
            "a PLD; in a run, each client's realised participation is composed "
            "and the run stops before any client would pass the budget (the "
            "participation draws do not depend on the data)",
        ),
        Analysis(
            "paper",
            "invalid",
            "the paper's amplification by the check-in probability: every "
            "round's release Poisson(p)-subsampled, composed over all rounds. "
            "Not valid against the server (it sees who checked in), and not "
            "shown valid for observers of the model either: each message "
            "carries its own noise, so the aggregate's noise level reveals how "
            "many took part, and the hidden private submodel carries data "
            "across rounds",
            adversary="parties that see the aggregate only, not who took part",
        ),
    ),
    per_participant=("sound",),
)

_ZERO_OUT = (
    "zero-out: one client's data replaced by data whose clipped update and norm "
    "are zero (the client stays enrolled; Kairouz et al. 2021)"
)

TWO_STAGE = Scheme(
    "two-stage norm-proportional sampling with client-side noise (LOCKS)",
    unit="client",
    neighbouring=_ZERO_OUT,
    adversary=_SERVER_SEES,
    analyses=(
        Analysis(
            "server",
            "proven",
            "exact Gaussian composition of what the server sees: every noisy "
            "norm (sensitivity C) and every noisy update (sensitivity C) a "
            "client sent; before a run, each round is the public-label mixture "
            "(w.p. q1 the norm, and w.p. at most max p2 also the update); in a "
            "run, each client's realised releases are composed and the run "
            "stops before any client would pass the budget (a Gaussian-DP "
            "filter, Smith & Thakurta 2022)",
        ),
        Analysis(
            "observer",
            "proven",
            "bounded by the server's view, of which the released models are a "
            "post-processing. No amplification by sampling is claimed: the noise "
            "is added by the clients, so the norm of each released update "
            "reveals how many clients (and which 1/p2 weights) took part, and an "
            "empty round leaves the model unchanged",
            adversary="sees the released models only",
        ),
    ),
    per_participant=("server", "observer"),
)


# -- which scheme an event belongs to ---------------------------------------------
@functools.singledispatch
def scheme_of(event: ev.Event) -> Scheme:
    """Return the scheme an event belongs to.

    Raises
    ------
    UnsupportedEventError
        If the event type has no scheme.
    """
    raise UnsupportedEventError(f"no scheme is known for event {type(event).__name__}")


@scheme_of.register
def _(event: ev.Gaussian) -> Scheme:
    return GAUSSIAN


@scheme_of.register
def _(event: ev.PoissonSampled) -> Scheme:
    return POISSON_SAMPLED


@scheme_of.register
def _(event: ev.RecordPoisson) -> Scheme:
    return RECORD_POISSON


@scheme_of.register
def _(event: ev.ClientPoisson) -> Scheme:
    if isinstance(event.event, ev.RecordPoisson):
        return RANDOM_PARTICIPATION
    return CLIENT_POISSON


@scheme_of.register
def _(event: ev.FixedCohort) -> Scheme:
    return FIXED_COHORT


@scheme_of.register
def _(event: ev.WithoutReplacement) -> Scheme:
    return WITHOUT_REPLACEMENT


@scheme_of.register
def _(event: ev.CheckIn) -> Scheme:
    return CHECK_IN


@scheme_of.register
def _(event: ev.TwoStage) -> Scheme:
    return TWO_STAGE


@scheme_of.register
def _(event: ev.SelfComposed) -> Scheme:
    return scheme_of(event.event)


#: Analyses that are closed-form formulas of a paper rather than accountant
#: analyses, by scheme: reported beside the accountant's, with their status.
FORMULAS: dict[str, Analysis] = {
    "gaussian/classic": Analysis(
        "classic",
        "proven",
        "sigma = sqrt(2 ln(1.25/delta)) / epsilon (Dwork & Roth 2014, Thm A.1); "
        "valid only for epsilon < 1, and looser than the analytic Gaussian",
    ),
    "prifedsync/clt": Analysis(
        "clt",
        "invalid",
        "the paper's central-limit mu (Zheng et al. 2021, Thm 2: mu = sqrt(2) c "
        "sqrt(e^{1/s^2} Phi(1.5/s) + 3 Phi(-0.5/s) - 2)): an approximation, not "
        "a bound; it overstates or understates the exact composition",
    ),
    "ms-pafl/central": Analysis(
        "central",
        "invalid",
        "Theorem 2 / Corollary 1 (one round of the global model, exact binomial "
        "tail): amplification by check-in and data subsampling, which the "
        "server's view of who checked in and the hidden private submodel "
        "invalidate",
        adversary="parties that see the global public model only",
    ),
    "ms-pafl/central-hoeffding": Analysis(
        "central-hoeffding",
        "invalid",
        "Theorem 2 as printed (Hoeffding tail); same caveat as 'central'",
        adversary="parties that see the global public model only",
    ),
    "ms-pafl/local": Analysis(
        "local",
        "invalid",
        "Theorem 3 (moments accountant with the expected p*R rounds and "
        "gamma amplification): an expectation is not a bound, and the hidden "
        "private submodel invalidates gamma",
    ),
    "ms-pafl/global": Analysis(
        "global",
        "invalid",
        "Theorem 4 (strong composition of the Theorem-2 round): same caveat as "
        "'central'",
        adversary="parties that see the global public model only",
    ),
}

#: Every scheme, for listings and tests.
SCHEMES: tuple[Scheme, ...] = (
    GAUSSIAN,
    POISSON_SAMPLED,
    RECORD_POISSON,
    CLIENT_POISSON,
    RANDOM_PARTICIPATION,
    FIXED_COHORT,
    WITHOUT_REPLACEMENT,
    CHECK_IN,
    TWO_STAGE,
)


def all_analyses() -> tuple[str, ...]:
    """Every analysis name some scheme offers (sorted)."""
    return tuple(sorted({a.name for s in SCHEMES for a in s.analyses}))


def resolve_analysis(event: ev.Event, analysis: str | None) -> str:
    """The analysis that prices ``event`` when ``analysis`` is asked for.

    ``None`` means the event's default. A scheme with a single analysis (the
    standard mechanisms) prices every request the same way, since there is
    nothing to choose; a scheme with several must offer ``analysis``.

    Raises
    ------
    UnsupportedEventError
        If the scheme offers several analyses and not ``analysis``.
    """
    scheme = scheme_of(event)
    if analysis is None or len(scheme.analyses) == 1:
        return scheme.default
    return scheme.analysis(analysis).name


def analysis_of(event: ev.Event, analysis: str | None = None) -> Analysis:
    """The :class:`Analysis` that prices ``event`` (see :func:`resolve_analysis`)."""
    return scheme_of(event).analysis(resolve_analysis(event, analysis))


def check_analysis_name(analysis: str | None) -> str | None:
    """Return ``analysis`` if some scheme offers it (``None`` passes).

    Raises
    ------
    InvalidParameterError
        If no scheme offers an analysis of that name.
    """
    if analysis is not None and analysis not in all_analyses():
        raise InvalidParameterError(
            f"analysis must be one of {list(all_analyses())} (or None for each "
            f"scheme's default); got {analysis!r}"
        )
    return analysis


def describe(event: ev.Event, analysis: str | None = None) -> dict[str, Any]:
    """The guarantee's full statement for ``event`` under ``analysis``.

    Returns
    -------
    dict
        ``scheme``, ``unit``, ``neighbouring``, ``adversary``, ``analysis``,
        ``status`` and ``basis`` (all strings).
    """
    scheme = scheme_of(event)
    a = analysis_of(event, analysis)
    return {
        "scheme": scheme.name,
        "unit": scheme.unit,
        "neighbouring": a.neighbouring or scheme.neighbouring,
        "adversary": a.adversary or scheme.adversary,
        "analysis": a.name,
        "status": a.status,
        "basis": a.basis,
    }


def per_participant(event: ev.Event, analysis: str | None = None) -> bool:
    """Whether a run charges ``event`` to each unit only when it took part."""
    return resolve_analysis(event, analysis) in scheme_of(event).per_participant
