"""``dpfl account|calibrate dp-sgd`` against independently computed values.

Setting A is a small DP-SGD run (q = 1/38, T = 190, sigma = 0.91, delta =
1e-5); each row is compared with the same quantity computed here directly:
the exact row with dp_accounting's PLD accountant (connect-the-dots, a
different discretisation of the same privacy-loss distribution), the rdp row
with dp_accounting's RDP accountant, the gdp-clt row with Bu et al.'s closed
form solved here with scipy. Tolerances are stated at each check.
"""

from __future__ import annotations

import json
import math

import pytest
from dp_accounting import dp_event
from dp_accounting.pld import pld_privacy_accountant
from dp_accounting.rdp import rdp_privacy_accountant
from scipy import optimize, stats

from dpfl.cli.main import main

Q, T, SIGMA, DELTA = 1 / 38, 190, 0.91, 1e-5
POISSON = ["--q", repr(Q), "--steps", str(T)]


def _json(capsys, argv):
    assert main([*argv, "--json"]) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


def _row(capsys, analysis, *extra):
    argv = ["account", "dp-sgd", *POISSON, "--noise-multiplier", str(SIGMA)]
    return _json(capsys, [*argv, "--analysis", analysis, *extra])


def test_exact_matches_dp_accountings_pld(capsys):
    got = _row(capsys, "exact")
    acc = pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-4)
    one = dp_event.PoissonSampledDpEvent(Q, dp_event.GaussianDpEvent(SIGMA))
    acc.compose(dp_event.SelfComposedDpEvent(one, T))
    reference = acc.get_epsilon(DELTA)  # 2.9816 (a pessimistic estimate)
    # dpfl's certified bracket is 1e-4 wide (relative); the two discretise
    # differently, so they agree to 2e-4 relative
    assert got["epsilon_lower"] <= got["epsilon"] <= got["epsilon_lower"] * 1.0002
    assert got["epsilon"] == pytest.approx(reference, rel=2e-4)
    assert got["status"] == "proven" and got["unit"] == "record"
    assert got["neighbouring"] == "add/remove of one record" and got["steps"] == T


def test_rdp_is_dp_accountings_rdp_and_looser(capsys):
    got = _row(capsys, "rdp")
    acc = rdp_privacy_accountant.RdpAccountant()
    acc.compose(dp_event.PoissonSampledDpEvent(Q, dp_event.GaussianDpEvent(SIGMA)), T)
    assert got["epsilon"] == pytest.approx(acc.get_epsilon(DELTA), rel=1e-9)
    assert got["epsilon"] > 1.1 * _row(capsys, "exact")["epsilon"]  # 3.505 > 2.982


def test_gdp_clt_is_bu_et_al_and_labelled_invalid(capsys):
    got = _row(capsys, "gdp-clt")
    mu = Q * math.sqrt(T * math.expm1(SIGMA**-2))

    def delta(eps):  # mu-GDP's delta(eps) (Dong, Roth & Su 2022, Cor. 2.13)
        return stats.norm.cdf(-eps / mu + mu / 2) - math.exp(eps) * stats.norm.cdf(
            -eps / mu - mu / 2
        )

    reference = optimize.brentq(lambda e: delta(e) - DELTA, 1e-6, 50, xtol=1e-12)
    assert got["epsilon"] == pytest.approx(reference, rel=1e-6)  # 2.2423
    assert got["status"] == "invalid"
    assert got["epsilon"] < _row(capsys, "exact")["epsilon"]  # it understates


def test_calibrate_meets_the_target_and_no_less_noise_would(capsys):
    argv = ["calibrate", "dp-sgd", *POISSON, "--epsilon", "3", "--delta", "1e-5"]
    sigma = _json(capsys, argv)["noise_multiplier"]
    assert 0.905 < sigma < 0.910  # dp_accounting's PLD calibration: 0.9077
    at = ["account", "dp-sgd", *POISSON, "--noise-multiplier"]
    assert _json(capsys, [*at, repr(sigma)])["epsilon"] <= 3.0
    # the calibrator's resolution is 0.1% of sigma
    assert _json(capsys, [*at, repr(sigma * 0.997)])["epsilon"] > 3.0


def test_fixed_batches_replace_one_cost_more_than_poisson_add_remove(capsys):
    fixed = ["account", "dp-sgd", "--sampling", "fixed", "--batch-size", "10"]
    fixed += ["--dataset-size", "380", "--epochs", "5", "--noise-multiplier", "1"]
    exact = _json(capsys, fixed)
    assert exact["steps"] == 190 and exact["sampling_rate"] == pytest.approx(Q)
    assert exact["neighbouring"].startswith("replace-one")
    rdp = _json(capsys, [*fixed, "--analysis", "rdp"])
    as_poisson = _json(capsys, [*fixed, "--analysis", "as-poisson"])
    # RDP of the same sampler (Wang, Balle & Kasiviswanathan) is a looser bound
    # of the same quantity; the Poisson reading is smaller, and not valid here
    assert as_poisson["epsilon"] < exact["epsilon"] < rdp["epsilon"]
    assert as_poisson["status"] == "invalid"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--steps", "10"], "needs --q, or --batch-size and --dataset-size"),
        (["--q", "0.1", "--batch-size", "3", "--steps", "10"], "either --q or"),
        (["--sampling", "fixed", "--q", "0.1", "--steps", "10"], "--batch-size"),
        (["--q", "0.1", "--steps", "10", "--analysis", "as-poisson"], "not one of"),
        (["--q", "1e-6", "--epochs", "1000"], "steps"),
    ],
)
def test_bad_flags_give_one_line(capsys, argv, message):
    assert main(["account", "dp-sgd", *argv, "--noise-multiplier", "1"]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.splitlines()) == 1


def test_the_docs_page_shows_what_dpfl_computes(capsys):
    # docs/dp-sgd.md quotes tools/dp_sgd_accountants.py's output; its dpfl rows
    # for setting A must be what dpfl computes now (to the 5 figures shown)
    from pathlib import Path

    page = (Path(__file__).resolve().parents[2] / "docs" / "dp-sgd.md").read_text()
    section = page.split("**Setting A**")[1].split("**Setting B**")[0]
    shown = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) == 4 and cells[0].startswith("dpfl `"):
            shown[cells[0].split("`")[1]] = float(cells[2])
    assert set(shown) >= {"exact", "rdp", "gdp-clt"}
    for analysis in ("exact", "rdp", "gdp-clt"):
        got = _row(capsys, analysis)["epsilon"]
        assert float(f"{got:.5g}") == shown[analysis], analysis
