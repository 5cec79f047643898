"""Privacy accounting for federated learning: pure numerics, no torch.

Events describe a round, the :class:`Accountant` prices them as certified
upper and lower bounds, and the :class:`PrivacyLedger` records a run's spend.
Each paper's analyses live in their own module: :mod:`.participation`
(random participation), :mod:`.fdp` (federated f-DP / PriFedSync),
:mod:`.rdp` (client-level DP-FedAvg, LOCKS), :mod:`.checkin` (MS-PAFL),
:mod:`.gaussian`, :mod:`.composition`, :mod:`.pld` and :mod:`.calibrate`.
"""

from dpfl.accounting.accountant import Accountant, price
from dpfl.accounting.bounds import Bound, Guarantee
from dpfl.accounting.calibrate import (
    calibrate_noise_multiplier,
    calibrate_rounds,
    calibrate_sampling_rate,
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
)

__all__ = [
    "Accountant",
    "Bound",
    "Budget",
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
    "RecordPoisson",
    "SelfComposed",
    "TwoStage",
    "WithoutReplacement",
    "calibrate_noise_multiplier",
    "calibrate_rounds",
    "calibrate_sampling_rate",
    "event_from_dict",
    "event_to_dict",
    "price",
    "scale_noise",
]
