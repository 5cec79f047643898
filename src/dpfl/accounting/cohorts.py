"""Fixed-size cohorts with Poisson records: event, scheme and price.

Each round the server picks exactly ``cohort_size`` (m) of ``population`` (K)
clients, uniformly without replacement; each chosen client includes each of
its records independently w.p. ``sampling_probability`` (q), clips each
record's gradient to C and sends the sum; a trusted server adds Gaussian noise
of std ``noise_multiplier * C`` to the total and releases it. The privacy unit
is a record, under add/remove of one record to some client's data (the
clients, hence K and m, are public).

The analysis (proven, ``"wcs"``)
--------------------------------
Reveal the round's cohort to the adversary: it can only help it, so a bound
for the revealed mechanism bounds the real one (the real output is a
post-processing of the pair cohort + output). Given the cohort:

* if the record's client is not in it, the record is never used and the two
  neighbouring outputs have the same law (no loss);
* if it is, the record joins w.p. q independently of every other record (the
  records' coins are independent of each other and of the cohort draw) and
  of the data. Revealing also which other records were sampled (joint
  convexity), the pair is that of the Poisson(q)-subsampled Gaussian of
  sensitivity 1 in units of C: ((1-q) N(0, σ²) + q N(1, σ²), N(0, σ²)).

The client is in a uniform size-m cohort w.p. exactly m/K, by symmetry,
independently across rounds (each round's cohort is a fresh draw), and the
label "in the cohort or not" is seen. So each round is the public-label
mixture "w.p. m/K a Poisson(q)-subsampled Gaussian, else nothing", which is
the dominating pair of random participation's ``"wcs"`` analysis
(Hasircioglu & Gündüz, arXiv 2205.01556, Theorem 5.2) with p = m/K, and it is
priced by the same code (:func:`dpfl.accounting.participation.participation_pld`).
Dominating pairs compose adaptively (Zhu, Dong & Wang 2022), so T rounds are
its T-fold composition.

What is *not* valid (``"cs"``, reported for comparison only)
-------------------------------------------------------------
Reading the record's participation as one Bernoulli(m q / K) coin, i.e. the
Poisson-subsampled Gaussian at rate m q / K, hides the cohort. It is not an
upper bound: when the record's client is chosen, its other records join too
(their gradients move the sum as well, so they are not independent of the
record's presence), and with a cohort of fixed size, whether this client is
in it changes which other clients are. Random participation's ``"cs"``
(Corollary 5.3) fails for the first reason, and the fixed-cohort
``"paper-pld"`` reading (:data:`dpfl.accounting.schemes.FIXED_COHORT`) for
the second. It is the figure companions with zero gradients and a
one-record-per-client population would attain, a lower reference.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from dpfl._validate import check_count, check_probability
from dpfl.accounting import events as ev
from dpfl.accounting import participation, pricing, schemes
from dpfl.errors import UnsupportedEventError

__all__ = ["COHORT_RECORD_POISSON", "CohortRecordPoisson"]


@dataclasses.dataclass(frozen=True, slots=True)
class CohortRecordPoisson(ev.Event):
    """Exactly ``cohort_size`` of ``population`` clients, then records w.p. q.

    Parameters
    ----------
    cohort_size : int
        m, clients per round (``1 <= m <= K``), uniformly without replacement.
    population : int
        K, the clients (>= 1).
    sampling_probability : float
        q in (0, 1]: each record of a chosen client joins w.p. q.
    records_per_client : int
        d, the largest client's number of records (>= 0; it does not enter
        the proven price, which reveals the other records).
    event : Event
        The release on the sampled records' clipped sum (a
        :class:`~dpfl.accounting.events.Gaussian`).
    """

    cohort_size: int
    population: int
    sampling_probability: float
    records_per_client: int
    event: ev.Event

    def __post_init__(self) -> None:
        ev.check_cohort(self.cohort_size, self.population)
        check_probability("record_probability", self.sampling_probability)
        check_count("records_per_client", self.records_per_client, minimum=0)
        ev.check_event("event", self.event)

    @property
    def cohort_fraction(self) -> float:
        """m/K: the probability that a given client is in the cohort."""
        return self.cohort_size / self.population


COHORT_RECORD_POISSON = schemes.Scheme(
    "fixed-size cohorts with Poisson records",
    unit="record",
    neighbouring="add/remove of one record (clients, cohort size public)",
    adversary="sees each round's noisy aggregate (noise added by a trusted "
    "server), not which records were sampled",
    analyses=(
        schemes.Analysis(
            "wcs",
            "proven",
            "the cohort revealed (a relaxation): w.p. m/K the record's client "
            "is chosen and the round is a Poisson(q)-subsampled Gaussian, else "
            "nothing; the public-label mixture of Hasircioglu & Gunduz's "
            "Theorem 5.2 with p = m/K, composed as a PLD (Zhu, Dong & Wang "
            "2022)",
            adversary="sees each round's noisy aggregate and the cohort",
        ),
        schemes.Analysis(
            "cs",
            "invalid",
            "the record read as Poisson-sampled at rate m q / K: ignores that a "
            "chosen client's other records join with it and that a fixed-size "
            "cohort ties the clients' draws together; a reference, not a bound",
        ),
    ),
)


@schemes.scheme_of.register
def _scheme(event: CohortRecordPoisson) -> schemes.Scheme:
    return COHORT_RECORD_POISSON


@pricing.prices(CohortRecordPoisson)
def _price(
    event: CohortRecordPoisson, *, analysis: str, discretization: float
) -> pricing.PldPair:
    sigma = pricing.unit_gaussian(event.event)
    if sigma is None:
        raise UnsupportedEventError(
            f"fixed cohorts with Poisson records are priced over a Gaussian; got "
            f"{event.event!r}"
        )
    if analysis == "cs":
        return pricing.poisson_of_gaussian(
            event.cohort_fraction * event.sampling_probability,
            event.event,
            discretization,
        )
    kw: dict[str, Any] = {
        "participation_probability": event.cohort_fraction,
        "record_probability": event.sampling_probability,
        "records_per_client": event.records_per_client,
        "noise_multiplier": sigma,
        "analysis": "wcs",
        "value_discretization": discretization,
    }
    return (
        participation.participation_pld(pessimistic=True, **kw),
        participation.participation_pld(pessimistic=False, **kw),
    )
