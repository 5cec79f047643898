"""Privacy accounting for federated learning: pure numerics, no torch.

Events describe a round, the :class:`Accountant` prices them as certified
upper and lower bounds, and the :class:`PrivacyLedger` records a run's spend.
Each paper's analyses live in their own module: :mod:`.participation`
(random participation), :mod:`.fdp` (federated f-DP / PriFedSync),
:mod:`.rdp` (client-level DP-FedAvg, LOCKS), :mod:`.checkin` (MS-PAFL),
:mod:`.checkins_balle` (Balle et al. 2020's random check-ins, the comparison
of random participation's Figure 4),
:mod:`.gaussian`, :mod:`.composition`, :mod:`.pld` and :mod:`.calibrate`;
:mod:`.schemes` says what each event's guarantee means and which analyses
price it, with their status.
"""

from dpfl.accounting import checkins_balle
from dpfl.accounting.accountant import Accountant, price
from dpfl.accounting.bounds import Bound, Guarantee
from dpfl.accounting.calibrate import (
    CertifiesEverySigma,
    calibrate_noise_multiplier,
    calibrate_rounds,
    calibrate_sampling_rate,
    solve_noise_multiplier,
)
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
from dpfl.accounting.ledger import (
    Budget,
    LedgerEntry,
    MomentsAccountantLedger,
    PrivacyLedger,
    RdpLedger,
)
from dpfl.accounting.schemes import Analysis, Scheme, describe, scheme_of

__all__ = [
    "Accountant",
    "Analysis",
    "Bound",
    "Budget",
    "CertifiesEverySigma",
    "CheckIn",
    "ClientPoisson",
    "Event",
    "FixedCohort",
    "Gaussian",
    "Guarantee",
    "LedgerEntry",
    "MomentsAccountantLedger",
    "PoissonSampled",
    "PrivacyLedger",
    "RdpLedger",
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
    "scale_noise",
    "scheme_of",
    "solve_noise_multiplier",
]
