"""Empirical privacy auditing: lower bounds on ε by attacking a mechanism.

An upper bound (:mod:`dpfl.accounting`) says how private a release is *at
most*; an audit says how private it is *at least*: it samples the mechanism
on a neighbouring pair, runs a distinguishing test and turns the test's error
rates into an ε lower bound that holds with a stated confidence
(:mod:`dpfl.audit.stats`). A lower bound above a claimed ε proves the claim
wrong (or the implementation broken); a lower bound well below it says
nothing about the claim, only about this attack.

:mod:`dpfl.audit.mechanisms` samples a mechanism with numpy;
:mod:`dpfl.audit.canaries` (imports torch) inserts Dirac canaries into a real
DP-FedAvg or DP-DSGD run and :mod:`dpfl.audit.training` audits it;
:mod:`dpfl.audit.onerun` is the one-run bound of Steinke, Nasr & Jagielski
(2023); :mod:`dpfl.audit.plot` draws the trade-off figure.
"""

from dpfl.audit.mechanisms import (
    GaussianPair,
    MechanismPair,
    PrivatizerPair,
    RandomParticipationPair,
    SubsampledGaussianPair,
    audit_mechanism,
)
from dpfl.audit.onerun import one_run_epsilon, one_run_guesses, one_run_p_value
from dpfl.audit.stats import (
    AuditResult,
    clopper_pearson_upper,
    epsilon_from_counts,
    score_audit,
)

__all__ = [
    "AuditResult",
    "GaussianPair",
    "MechanismPair",
    "PrivatizerPair",
    "RandomParticipationPair",
    "SubsampledGaussianPair",
    "audit_mechanism",
    "clopper_pearson_upper",
    "epsilon_from_counts",
    "one_run_epsilon",
    "one_run_guesses",
    "one_run_p_value",
    "score_audit",
]
