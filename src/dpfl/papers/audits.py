"""The two kinds of ``dpfl audit``, shared by the papers that offer them.

A *mechanism audit* (:func:`mechanism_audit`) attacks one release of a
paper's mechanism with a likelihood-ratio test (:func:`dpfl.audit.audit_mechanism`)
and sets the empirical lower bound on ε beside every analysis's upper bound.
A *training audit* (:func:`training_audit`) plants canaries in real runs of an
algorithm on the digits (:func:`dpfl.audit.training.audit_training`) and sets
the lower bound beside the ε the run reports.
"""

from __future__ import annotations

import argparse
import math
from typing import Any

from dpfl.errors import InvalidParameterError
from dpfl.papers.base import DEFAULT_DELTA
from dpfl.papers.report import Report

__all__ = [
    "TRAINING_DOMAINS",
    "mechanism_audit",
    "mechanism_flags",
    "training_audit",
    "training_flags",
]

#: The training audits run real rounds on the digits (1,347 training records),
#: so their flags are bounded more narrowly (see :attr:`Audit.domains`).
TRAINING_DOMAINS: dict[str, dict[str, Any]] = {
    "clients": {"high": 1_347, "why": " (the digits' training records)"},
    "rounds": {"high": 10_000, "why": ""},
    "noise_multiplier": {"low": 0.0, "low_open": True, "why": ""},
}


def mechanism_flags(p: argparse.ArgumentParser) -> None:
    """The flags of every mechanism audit: trials, confidence and seed."""
    p.add_argument(
        "--trials",
        type=int,
        default=1_000_000,
        help="trials on each side of the neighbouring pair (default 1e6)",
    )
    p.add_argument(
        "--confidence",
        type=float,
        default=0.95,
        help="probability that the lower bound holds (default 0.95)",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the audit (default 0)")


def mechanism_audit(
    a: argparse.Namespace, upper: Report, pair: Any, what: str
) -> Report:
    """Attack ``pair`` and set the lower bound beside ``upper``'s analyses.

    Parameters
    ----------
    a : argparse.Namespace
        The flags (``trials``, ``delta``, ``confidence``, ``seed``).
    upper : Report
        The paper's account of the same mechanism (its rows are compared).
    pair : Any
        The neighbouring pair of output distributions (:mod:`dpfl.audit`).
    what : str
        What was attacked, for the notes.

    Returns
    -------
    Report
        The lower bound with its confidence, the chosen upper bound, and each
        analysis's row marked refuted where the lower bound exceeds it.
    """
    from dpfl.audit import audit_mechanism

    if a.epsilon is not None:
        raise InvalidParameterError(
            "dpfl audit reports epsilon at a delta: give --delta, not --epsilon"
        )
    res = audit_mechanism(
        pair,
        trials=a.trials,
        delta=a.delta,
        rounds=getattr(a, "rounds", 1),
        confidence=a.confidence,
        seed=a.seed,
    )
    claimed = float(upper.result["epsilon"])
    result = {
        "epsilon_lower_bound": res.epsilon,
        "confidence": res.confidence,
        "delta": res.delta,
        "epsilon_upper_bound": claimed,
        "upper_bound_analysis": upper.result.get("analysis", "exact"),
        "ratio": res.epsilon / claimed if claimed > 0 else math.inf,
        "audited": what,
        "trials": res.negatives_trials,
        "false_positives": res.false_positives,
        "false_negatives": res.false_negatives,
        "threshold": res.threshold,
    }
    rows = [
        {**r, "refuted_by_audit": res.epsilon > float(r["epsilon"])}
        for r in upper.rows
        if "epsilon" in r
    ]
    notes = upper.notes + [
        f"audit: epsilon >= {res.epsilon:.4g} at delta={res.delta:g} with "
        f"confidence {res.confidence:g} ({what}; likelihood-ratio test, "
        f"{res.negatives_trials} trials a side, Clopper-Pearson intervals); an "
        "upper bound below it is refuted"
    ]
    return Report(f"Audit of {upper.title}", result, rows, notes)


def training_flags(p: argparse.ArgumentParser, record: bool) -> None:
    """The flags of a training audit (``record``: record-level DP-DSGD)."""
    p.add_argument(
        "--clients",
        type=int,
        default=20,
        help="real clients on the digits (default 20)",
    )
    p.add_argument(
        "--canaries",
        type=int,
        default=1000,
        help="Dirac canaries per run, one model coordinate each (default 1000)",
    )
    p.add_argument("--rounds", type=int, default=3, help="rounds per run (default 3)")
    p.add_argument("--runs", type=int, default=1, help="independent runs (default 1)")
    p.add_argument("--noise-multiplier", type=float, required=True, help="sigma")
    p.add_argument("--clip", type=float, default=1.0, help="clipping bound C")
    if record:
        p.add_argument("--p", type=float, default=0.5, help="participation prob.")
        p.add_argument("--q", type=float, default=0.5, help="record sampling prob.")
    else:
        p.add_argument(
            "--sampling",
            default="all",
            choices=("all", "poisson"),
            help="every client every round (fixed cohort of K), or Poisson clients "
            "at --participation (default all)",
        )
        p.add_argument(
            "--participation",
            type=float,
            default=0.1,
            help="a client's per-round probability with --sampling poisson",
        )
    p.add_argument(
        "--hidden", type=int, default=64, help="MLP hidden width (default 64)"
    )
    p.add_argument(
        "--protocol",
        default="multi-run",
        choices=("multi-run", "one-run"),
        help="multi-run: canaries on disjoint coordinates as independent trials, "
        "Clopper-Pearson; one-run: Steinke, Nasr & Jagielski (2023) guesses",
    )
    p.add_argument(
        "--threat",
        default="white-box",
        choices=("white-box", "black-box"),
        help="white-box: the adversary sees every round's noisy aggregate; "
        "black-box: the final model only (one-run protocol)",
    )
    p.add_argument(
        "--delta",
        type=float,
        default=DEFAULT_DELTA,
        help="delta of both bounds",
    )
    p.add_argument(
        "--confidence",
        type=float,
        default=0.95,
        help="probability that the lower bound holds (default 0.95)",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the runs (default 0)")
    p.add_argument("--json", action="store_true", help="print JSON for scripts")
    p.add_argument(
        "--plot", metavar="FILE", help="write the trade-off figure (FILE.png, .pdf)"
    )


def training_audit(
    a: argparse.Namespace, algorithm: str, params: dict[str, Any]
) -> Report:
    """Audit real runs of ``algorithm`` (with ``params``) on the digits.

    Parameters
    ----------
    a : argparse.Namespace
        The flags of :func:`training_flags`.
    algorithm : str
        The registered algorithm's name.
    params : dict
        Its parameters.

    Returns
    -------
    Report
        The lower bound beside the run's reported ε; ``--plot`` draws the
        trade-off figure.
    """
    import torch

    from dpfl.audit.plot import plot_tradeoff
    from dpfl.audit.training import audit_training
    from dpfl.data import get_dataset
    from dpfl.models import build_model

    data = get_dataset("digits", num_clients=a.clients, seed=a.seed)

    def model(ds: Any) -> Any:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(a.seed)
            return build_model(
                "mlp",
                input_shape=ds.input_shape,
                num_classes=ds.num_classes,
                hidden=(a.hidden,),
            )

    res = audit_training(
        algorithm,
        params,
        data,
        noise_multiplier=a.noise_multiplier,
        model=model,
        canaries=a.canaries,
        rounds=a.rounds,
        delta=a.delta,
        protocol=a.protocol,
        threat=a.threat,
        runs=a.runs,
        confidence=a.confidence,
        seed=a.seed,
    )
    result = {
        "epsilon_lower_bound": res.epsilon,
        "confidence": res.confidence,
        "delta": res.delta,
        "epsilon_upper_bound": res.reported_epsilon,
        "ratio": res.ratio,
        **{
            k: v
            for k, v in res.to_dict().items()
            if k not in ("epsilon", "delta", "confidence", "reported_epsilon", "ratio")
        },
    }
    notes = [
        f"audit: epsilon >= {res.epsilon:.4g} at delta={res.delta:g} with confidence "
        f"{res.confidence:g} ({res.level}-level Dirac canaries in a real "
        f"{res.algorithm} run on the digits, {res.threat}, {res.protocol}); dpfl "
        f"reports epsilon <= {res.reported_epsilon:.4g}: a lower bound on this "
        "implementation against this attack, not a proof of privacy"
    ]
    row = {
        "analysis": "audit",
        "epsilon": res.epsilon,
        "upper": res.reported_epsilon,
        "ratio": res.ratio,
    }
    return Report(
        f"Audit of {algorithm} ({res.level} level)",
        result,
        [row],
        notes,
        plot=lambda path: None if plot_tradeoff(res, path) else None,
    )
