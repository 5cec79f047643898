"""Privacy accounting for federated learning: pure numerics, no torch.

Events describe a round, the :class:`Accountant` prices them as certified
upper and lower bounds, and the :class:`PrivacyLedger` records a run's spend.
Each paper's analyses live in their own module: :mod:`.participation`
(random participation), :mod:`.fdp` (federated f-DP / PriFedSync),
:mod:`.rdp` (client-level DP-FedAvg, LOCKS), :mod:`.checkin` and
:mod:`.checkin_global` (MS-PAFL),
:mod:`.checkins_balle` (Balle et al. 2020's random check-ins, the comparison
of random participation's Figure 4),
:mod:`.gaussian`, :mod:`.composition`, :mod:`.pld` and :mod:`.calibrate`;
:mod:`.schemes` says what each event's guarantee means and which analyses
price it, with their status.
"""

# the formula modules register their events' prices (dpfl.accounting.pricing)
from dpfl.accounting import checkin as _checkin  # noqa: F401
from dpfl.accounting import checkins_balle
from dpfl.accounting import fdp as _fdp  # noqa: F401
from dpfl.accounting import participation as _participation  # noqa: F401
from dpfl.accounting import rdp as _rdp  # noqa: F401
from dpfl.accounting.accountant import Accountant
from dpfl.accounting.bounds import Bound, Guarantee
from dpfl.accounting.calibrate import (
    CertifiesEverySigma,
    calibrate_noise_multiplier,
    calibrate_rounds,
    calibrate_sampling_rate,
    solve_noise_multiplier,
)
from dpfl.accounting.chain import LedgerEntry
from dpfl.accounting.cohorts import CohortRecordPoisson
from dpfl.accounting.events import (
    CheckIn,
    ClientPoisson,
    Event,
    FixedCohort,
    Gaussian,
    PoissonSampled,
    RecordPoisson,
    SelfComposed,
    TwoStage,
    WithoutReplacement,
    event_from_dict,
    event_to_dict,
    scale_noise,
)
from dpfl.accounting.guards import Guard, MomentsAccountantGuard, RdpGuard
from dpfl.accounting.ledger import Budget, PrivacyLedger
from dpfl.accounting.pricing import price, prices
from dpfl.accounting.schemes import Analysis, Scheme, describe, scheme_of

__all__ = [
    "Accountant",
    "Analysis",
    "Bound",
    "Budget",
    "CertifiesEverySigma",
    "CheckIn",
    "ClientPoisson",
    "CohortRecordPoisson",
    "Event",
    "FixedCohort",
    "Gaussian",
    "Guarantee",
    "Guard",
    "LedgerEntry",
    "MomentsAccountantGuard",
    "PoissonSampled",
    "PrivacyLedger",
    "RdpGuard",
    "RecordPoisson",
    "Scheme",
    "SelfComposed",
    "TwoStage",
    "WithoutReplacement",
    "calibrate_noise_multiplier",
    "checkins_balle",
    "calibrate_rounds",
    "calibrate_sampling_rate",
    "describe",
    "event_from_dict",
    "event_to_dict",
    "price",
    "prices",
    "scale_noise",
    "scheme_of",
    "solve_noise_multiplier",
]
