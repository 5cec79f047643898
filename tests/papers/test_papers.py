"""dpfl.papers: one registry, and one road to epsilon for account, calibrate and runs.

`dpfl account` and `dpfl calibrate` must price a scheme's event with the same
Accountant that a run's ledger uses: the numbers are compared exactly with an
Accountant built here from the same parameters (same computation, so equal to
the last bit), and a calibrated sigma is checked against the Accountant's
certified epsilon on both sides of the calibrator's bracket (relative width
1e-3, the tolerance of solve_noise_multiplier).
"""

from __future__ import annotations

import argparse
import json

import pytest

from dpfl.accounting import events as ev
from dpfl.accounting.accountant import Accountant
from dpfl.cli.main import build_parser, main
from dpfl.papers import PAPERS, REPRODUCTIONS, audits


def run_json(capsys, *argv):
    assert main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def _choices(parser: argparse.ArgumentParser, dest: str) -> tuple[str, ...]:
    (action,) = [a for a in parser._actions if a.dest == dest]
    return tuple(action.choices)


def _scheme_parsers(command: str) -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    top = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    sub = next(
        a
        for a in top.choices[command]._actions
        if isinstance(a, argparse._SubParsersAction)
    )
    return dict(sub.choices)


def test_the_registry_is_what_the_command_line_offers():
    names = [p.name for p in PAPERS]
    assert len(set(names)) == len(names)
    for command in ("account", "calibrate"):
        assert list(_scheme_parsers(command)) == names
    for paper in PAPERS:
        # every analysis the table shows is one --analysis can choose, in order
        shown = [name for name, _ in paper.analyses()]
        offered = _choices(_scheme_parsers("account")[paper.name], "analysis")
        assert set(offered) <= set(shown), paper.name
    audit_names = [a.name for a in audits()]
    assert list(_scheme_parsers("audit")) == audit_names
    assert len(set(audit_names)) == len(audit_names)
    keys = [k for spec in REPRODUCTIONS.values() for k in (spec.key, *spec.aliases)]
    assert len(set(keys)) == len(keys)


@pytest.mark.parametrize(
    ("argv", "event", "rounds", "analysis"),
    [
        (
            ["random-participation", "--p", "0.1", "--q", "0.5"]
            + ["--records-per-client", "3", "--noise-multiplier", "2", "--rounds", "3"]
            + ["--analysis", "wcs", "--delta", "1e-5"],
            ev.ClientPoisson(0.1, ev.RecordPoisson(0.5, 3, ev.Gaussian(2.0))),
            3,
            "wcs",
        ),
        (
            ["dp-fedavg", "--clients", "100", "--cohort", "10", "--rounds", "20"]
            + ["--noise-multiplier", "1.1", "--delta", "1e-5"],
            ev.FixedCohort(10, 100, ev.Gaussian(1.1)),
            20,
            "sound",
        ),
        (
            ["ms-pafl", "--noise-multiplier", "2", "--rounds", "10"],
            ev.CheckIn(0.5, ev.Gaussian(2.0)),
            10,
            "sound",
        ),
        (
            ["locks", "--q1", "0.1", "--noise-multiplier", "1.5", "--rounds", "50"],
            ev.TwoStage(0.1, 1, 1.0, ev.Gaussian(6.0), ev.Gaussian(1.5)),
            50,
            "server",
        ),
        (
            ["gaussian", "--noise-multiplier", "2", "--sensitivity", "0.5"],
            ev.Gaussian(2.0, 0.5),
            1,
            None,
        ),
    ],
    ids=lambda v: v[0] if isinstance(v, list) else None,
)
def test_account_is_the_accountant(capsys, argv, event, rounds, analysis):
    out = run_json(capsys, "account", *argv)
    want = Accountant(analysis).compose(event, rounds).epsilon(1e-5)
    assert out["epsilon"] == want.upper  # the same computation: equal
    if "epsilon_lower" in out:
        assert out["epsilon_lower"] == want.lower


def test_prifedsync_exact_is_the_accountant(capsys):
    out = run_json(
        capsys,
        "account",
        "prifedsync",
        *["--noise-multiplier", "1", "--batch-size", "16"],
        *["--records-per-client", "600", "--local-steps", "5", "--rounds", "10"],
    )
    step = ev.WithoutReplacement(16, 600, ev.Gaussian(2.0))
    event = ev.CheckIn(1.0, ev.SelfComposed(step, 5))
    assert out["epsilon"] == Accountant().compose(event, 10).epsilon(1e-5).upper


def test_calibrated_sigma_meets_the_target_by_the_accountant(capsys):
    out = run_json(
        capsys,
        "calibrate",
        "dp-fedavg",
        *["--clients", "100", "--cohort", "50", "--rounds", "11"],
        *["--epsilon", "8", "--delta", "1e-3", "--analysis", "sound"],
    )
    sigma = out["noise_multiplier"]

    def epsilon(s: float) -> float:
        acc = Accountant("sound").compose(ev.FixedCohort(50, 100, ev.Gaussian(s)), 11)
        return acc.epsilon(1e-3).upper

    assert epsilon(sigma) <= 8.0  # meets the target, as a run's ledger checks it
    assert epsilon(sigma / 1.002) > 8.0  # and is the smallest such, to 1e-3
