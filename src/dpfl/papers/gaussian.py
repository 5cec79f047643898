"""One Gaussian mechanism (Balle & Wang 2018; Dwork & Roth 2014 for comparison).

The flags of ``dpfl account|calibrate gaussian`` and their event (a
:class:`~dpfl.accounting.events.Gaussian`), priced by the Accountant (exact:
the analytic Gaussian, μ-GDP in closed form) beside the classic formula
σ = sqrt(2 ln(1.25/δ))/ε; and ``dpfl audit gaussian``, an attack on one
release.
"""

from __future__ import annotations

import argparse
from typing import Any

import dpfl.papers.audits as audits
import dpfl.papers.report as report
from dpfl.papers.base import Audit, Paper, add_budget, add_common
from dpfl.papers.report import Report

__all__ = ["PAPER", "account", "calibrate", "event"]

#: The classic formula (see ``dpfl.accounting.schemes.FORMULAS``).
_CLASSIC = "gaussian/classic"


def _flags(p: argparse.ArgumentParser, calibrate: bool) -> None:
    p.add_argument(
        "--sensitivity",
        type=float,
        default=1.0,
        help="norm bound of one contribution in units of the clip (default 1)",
    )
    if not calibrate:
        p.add_argument(
            "--noise-multiplier",
            type=float,
            required=True,
            help="noise std / clip (sigma)",
        )
    p.add_argument(
        "--analysis",
        default="exact",
        choices=("exact", "classic"),
        help="exact (analytic Gaussian, default) or classic (Dwork-Roth formula)",
    )
    add_budget(p, calibrate)
    add_common(p, plot=not calibrate)


def event(a: argparse.Namespace, sigma: float) -> Any:
    """One release at noise multiplier ``sigma``, from the flags."""
    from dpfl.accounting import events as ev

    return ev.Gaussian(sigma, a.sensitivity)


def account(a: argparse.Namespace) -> Report:
    """``dpfl account gaussian``: ε at δ (or δ at ε) and the mechanism's μ."""
    from dpfl.accounting import gaussian

    e = event(a, a.noise_multiplier)
    target = {"epsilon": a.epsilon} if a.epsilon is not None else {"delta": a.delta}
    value: dict[str, Any] = report.bound(e, 1, None, lower=False, **target)
    value["mu"] = gaussian.mu_from_noise(
        noise_multiplier=a.noise_multiplier, sensitivity=a.sensitivity
    )
    row = {**value, **report.terms(e, None)}

    def plot(path: str) -> None:
        report.plot_curves(
            path,
            e,
            [row],
            delta=a.delta or a.default_delta,
            rounds=None,
            title=f"Gaussian mechanism: σ={a.noise_multiplier}, "
            f"sensitivity={a.sensitivity}",
        )

    notes = report.basis_notes(e, ["exact"])
    return Report("Gaussian mechanism", dict(row), [row], notes, plot)


def calibrate(a: argparse.Namespace) -> Report:
    """``dpfl calibrate gaussian``: the exact σ beside the classic formula's.

    The exact σ inverts the closed form by which the Accountant prices a
    Gaussian (μ-GDP, :func:`dpfl.accounting.gaussian.calibrate_analytic`),
    exactly and for any target, rather than by a search.
    """
    from dpfl.accounting import gaussian

    exact = gaussian.calibrate_analytic(
        epsilon=a.epsilon, delta=a.delta, sensitivity=a.sensitivity
    )
    classic, warning = gaussian.classic_sigma(
        epsilon=a.epsilon, delta=a.delta, sensitivity=a.sensitivity
    )
    e = event(a, exact)
    rows = [
        {"noise_multiplier": exact, **report.terms(e, None)},
        {
            "noise_multiplier": classic,
            **report.terms(e, None),
            **report.formula(_CLASSIC),
        },
    ]
    result = {**report.pick(rows, a.analysis), "analysis": a.analysis}
    notes = report.basis_notes(e, ["exact"]) + [
        f"classic: {report.formula_basis(_CLASSIC)}"
    ]
    return Report(
        "Gaussian mechanism calibration",
        result,
        rows,
        notes + ([warning] if warning else []),
    )


def _audit_flags(p: argparse.ArgumentParser) -> None:
    _flags(p, False)
    audits.mechanism_flags(p)


def _audit(a: argparse.Namespace) -> Report:
    from dpfl.audit import GaussianPair

    pair = GaussianPair(a.noise_multiplier, a.sensitivity)
    return audits.mechanism_audit(a, account(a), pair, "Gaussian pair")


def _analyses() -> list[tuple[str, str]]:
    from dpfl.accounting import events as ev

    return report.scheme_analyses(ev.Gaussian(1.0), [_CLASSIC])


PAPER = Paper(
    name="gaussian",
    summary="one Gaussian mechanism (analytic, Balle & Wang 2018)",
    flags=_flags,
    account=account,
    calibrate=calibrate,
    analyses=_analyses,
    audits=(
        Audit(
            "gaussian",
            "one Gaussian mechanism: the attack's lower bound beside the exact epsilon",
            _audit_flags,
            _audit,
        ),
    ),
)
