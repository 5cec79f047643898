"""The command line: the calls the issue lists, JSON keys, and one-line errors."""

import json
import os
import subprocess
import sys

import pytest

from dpfl.cli.main import main

TERMS = {"unit", "neighbouring", "adversary", "analysis"}


def run_json(capsys, *argv):
    assert main([*argv, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert TERMS <= set(out), f"missing terms in {sorted(out)}"
    return out


RP = ["--p", "0.001", "--q", "0.1", "--records-per-client", "30"]


@pytest.mark.parametrize("analysis", ["sound", "wcs", "paper", "ols", "cs"])
def test_calibrate_random_participation_per_round(capsys, analysis):
    out = run_json(
        capsys,
        "calibrate",
        "random-participation",
        *RP,
        "--epsilon",
        "0.015",
        "--delta",
        "1e-6",
        "--rounds",
        "1",
        "--analysis",
        analysis,
    )
    # docs/analyses.md reference table, scenario 1 (tolerance 0.5%).
    expected = {
        "sound": 2.4903,
        "wcs": 7.6651,
        "paper": 2.3715,
        "ols": 22.4975,
        "cs": 0.56737,
    }[analysis]
    assert out["noise_multiplier"] == pytest.approx(expected, rel=5e-3)
    assert out["analysis"] == analysis


def test_account_random_participation(capsys):
    out = run_json(
        capsys,
        "account",
        "random-participation",
        *RP,
        "--noise-multiplier",
        "2.5",
        "--rounds",
        "1000",
        "--delta",
        "1e-6",
        "--analysis",
        "sound",
    )
    assert 0 < out["epsilon_lower"] <= out["epsilon"]
    d = run_json(
        capsys,
        "account",
        "random-participation",
        *RP,
        "--noise-multiplier",
        "2.5",
        "--rounds",
        "1000",
        "--epsilon",
        "0.015",
        "--analysis",
        "wcs",
    )
    assert 0 < d["delta"] < 1


def test_prifedsync(capsys):
    args = [
        "account",
        "prifedsync",
        "--noise-multiplier",
        "1.0",
        "--batch-size",
        "16",
        "--records-per-client",
        "600",
        "--local-steps",
        "38",
        "--rounds",
        "93",
    ]
    clt = run_json(capsys, *args, "--analysis", "clt")
    assert clt["mu"] == pytest.approx(
        2.71, abs=5e-3
    )  # federated-f-dp.txt Table 1 row 1
    exact = run_json(capsys, *args, "--analysis", "exact", "--delta", "1e-5")
    assert exact["epsilon"] == pytest.approx(13.88, abs=0.02)  # docs/analyses.md table
    assert exact["mu_effective"] == pytest.approx(2.60, abs=0.01)


@pytest.mark.parametrize("analysis", ["paper-rdp", "sound-rdp", "sound"])
def test_dp_fedavg(capsys, analysis):
    out = run_json(
        capsys,
        "calibrate",
        "dp-fedavg",
        "--clients",
        "100",
        "--cohort",
        "50",
        "--rounds",
        "11",
        "--epsilon",
        "8",
        "--delta",
        "1e-3",
        "--analysis",
        analysis,
    )
    # Geyer et al.'s example (K = 100, m = 50, 11 rounds, eps 8, delta 1e-3),
    # computed independently with dp_accounting: 1.081 (RDP, Poisson reading,
    # improved conversion), 3.396 (RDP, WOR replace-one), 2.007 (PLD, WOR
    # replace-one: the default, the tightest proven analysis).
    expected = {"paper-rdp": 1.081, "sound-rdp": 3.396, "sound": 2.007}[analysis]
    assert out["noise_multiplier"] == pytest.approx(expected, rel=5e-3)
    acc = run_json(
        capsys,
        "account",
        "dp-fedavg",
        "--clients",
        "100",
        "--cohort",
        "50",
        "--noise-multiplier",
        "1.1",
        "--rounds",
        "11",
        "--epsilon",
        "8",
        "--analysis",
        "paper-rdp",
    )
    assert 0 < acc["delta"] < 1e-3  # sigma 1.1 > 1.081 meets delta 1e-3


def test_ms_pafl_and_locks(capsys):
    out = run_json(capsys, "account", "ms-pafl")
    assert out["epsilon"] > 0
    out = run_json(
        capsys,
        "account",
        "locks",
        "--q1",
        "0.1",
        "--noise-multiplier",
        "1.5",
        "--norm-noise-ratio",
        "3.3333",
        "--rounds",
        "100",
    )
    assert out["epsilon"] > 0


def test_table_output(capsys):
    assert (
        main(
            [
                "account",
                "dp-fedavg",
                "--clients",
                "100",
                "--cohort",
                "50",
                "--noise-multiplier",
                "1.1",
                "--rounds",
                "11",
                "--epsilon",
                "8",
            ]
        )
        == 0
    )
    text = capsys.readouterr().out
    for word in ("unit", "neighbouring", "adversary", "paper", "sound-rdp", "status"):
        assert word in text


@pytest.mark.parametrize(
    "argv, needle",
    [
        (
            [
                "account",
                "random-participation",
                "--p",
                "1.5",
                "--q",
                "0.1",
                "--records-per-client",
                "30",
                "--noise-multiplier",
                "1",
            ],
            "1.5",
        ),
        (["account", "gaussian", "--noise-multiplier", "-1"], "--noise-multiplier"),
        (
            [
                "account",
                "dp-fedavg",
                "--clients",
                "100",
                "--cohort",
                "50",
                "--noise-multiplier",
                "1",
                "--rounds",
                "3",
                "--delta",
                "2",
            ],
            "delta",
        ),
        (
            [
                "account",
                "dp-fedavg",
                "--clients",
                "-100",
                "--cohort",
                "50",
                "--noise-multiplier",
                "1",
                "--rounds",
                "3",
            ],
            "-100",
        ),
        (["account", "no-such-scheme"], "no-such-scheme"),
    ],
)
def test_bad_input_exits_2_with_one_line(argv, needle):
    proc = subprocess.run(
        [sys.executable, "-m", "dpfl.cli", *argv], capture_output=True, text=True
    )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert needle in lines[0]
    assert "Traceback" not in proc.stderr


def test_plot_writes_a_figure(tmp_path, capsys):
    out = tmp_path / "curves.png"
    argv = [
        "account",
        "dp-fedavg",
        "--clients",
        "100",
        "--cohort",
        "50",
        "--noise-multiplier",
        "1.1",
        "--rounds",
        "11",
        "--delta",
        "1e-3",
        "--analysis",
        "paper",
        "--json",
        "--plot",
        str(out),
    ]
    assert main(argv) == 0
    assert out.stat().st_size > 10_000  # a real PNG with two panels
    json.loads(capsys.readouterr().out)  # --json output stays pure JSON


@pytest.mark.parametrize(
    ("env", "want"),
    [
        ({}, "10000"),  # dpfl's default spin for its training commands
        ({"GOMP_SPINCOUNT": "123"}, "123"),  # the user's spin is kept
        ({"OMP_WAIT_POLICY": "PASSIVE"}, None),  # so is the user's policy
    ],
)
def test_command_line_shortens_the_openmp_spin_unless_the_user_chose(env, want):
    # GOMP_SPINCOUNT only acts if set before torch loads libgomp, so the check
    # runs in a fresh interpreter, and torch must still be unloaded after main.
    code = (
        "import os, sys\n"
        "from dpfl.cli.main import main\n"
        "main(['account', 'gaussian', '--noise-multiplier', '2', "
        "'--delta', '1e-5'])\n"
        "print('torch' in sys.modules, os.environ.get('GOMP_SPINCOUNT'))\n"
    )
    base = {
        k: v
        for k, v in os.environ.items()
        if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")
    }
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={**base, **env},
        check=True,
    )
    assert proc.stdout.splitlines()[-1] == f"False {want}"
