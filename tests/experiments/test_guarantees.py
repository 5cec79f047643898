"""Every epsilon dpfl prints is the guarantee it claims, with its terms.

One test (or group) per finding of the guarantees review; each states the
independent computation it is checked against and its tolerance. Items 11
(the paper's moments-accountant rule), 13 (client-added noise reveals who took
part) and 14 (the alignment lemma) are tested in ``test_rdp.py``,
``test_client_noise_leak.py`` and ``test_participation_configurations.py``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from dp_accounting.pld import privacy_loss_distribution as dpl
from scipy import optimize, stats

from dpfl.accounting import costs, gaussian, schemes
from dpfl.accounting import events as ev
from dpfl.accounting.accountant import Accountant
from dpfl.accounting.calibrate import calibrate_noise_multiplier
from dpfl.accounting.ledger import PrivacyLedger
from dpfl.cli.main import main
from dpfl.errors import DpflError, InvalidParameterError
from dpfl.experiments.presets import PRESET_DIR

ROOT = Path(__file__).resolve().parents[2]
PRESETS = PRESET_DIR


def run_json(capsys, *argv):
    assert main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def gdp_mixture_epsilon(delta, weights_mu2):
    """ε(δ) of a public-label mixture of Gaussian-DP releases, computed here.

    ``weights_mu2`` maps mu² of a possible total release to its probability;
    the mixture's hockey-stick curve is the weighted average of the GDP curves
    (Dong, Roth & Su 2022, Cor. 2.13), solved for ε with brentq.
    """

    def excess(eps):
        return (
            sum(
                w * gaussian.gdp_delta(eps, mu=math.sqrt(m2)) if m2 > 0 else 0.0
                for m2, w in weights_mu2.items()
            )
            - delta
        )

    return optimize.brentq(excess, 0.0, 200.0, xtol=1e-12)


# -- item 1: MS-PAFL's paper reading counts amplification once -------------------
def test_paper_checkin_counts_every_round_amplified_not_only_joined_ones():
    # The MS-PAFL preset's round: check-in p = 0.5, noise 3.9876 C on a release
    # of replace-one sensitivity 2C. Under the paper's reading every one of 30
    # rounds is a Poisson(p)-subsampled Gaussian; independent value:
    # dp_accounting's from_gaussian_mechanism(3.9876/2, sampling_prob=0.5)
    # composed 30 times, 7.127 at delta 1e-5 (tolerance 0.5%). Counting only a
    # client's joined rounds (about 15) as well gave 6.305 before.
    event = ev.CheckIn(0.5, ev.Gaussian(3.9876))
    ledger = PrivacyLedger(analysis="paper")
    rng = np.random.default_rng(0)
    for _ in range(30):
        ledger.record(event, participants=np.flatnonzero(rng.random(100) < 0.5))
    ref = dpl.from_gaussian_mechanism(
        3.9876 / 2, sampling_prob=0.5, value_discretization_interval=1e-4
    ).self_compose(30)
    expected = ref.get_epsilon_for_delta(1e-5)
    assert expected == pytest.approx(7.127, rel=5e-3)
    assert ledger.epsilon(1e-5).upper == pytest.approx(expected, rel=5e-3)


# -- item 2: no expected count presented as a bound ------------------------------
def test_account_ms_pafl_prices_every_round_with_its_visible_sampling(capsys):
    # Before a run the sound (server) view is the public-label mixture: a client
    # joins each of R rounds w.p. p, visibly, and pays a Gaussian of mu0 = 2/s
    # when it does. Independent value: sum over N ~ Binomial(R, p) of the GDP
    # curve of sqrt(N) mu0 (tolerance 1%). The expected-count figure (N = pR)
    # is below it: an expectation is not a bound.
    out = run_json(
        capsys,
        "account",
        "ms-pafl",
        "--probability",
        "0.5",
        "--noise-multiplier",
        "4.0",
        "--rounds",
        "50",
    )
    mu0 = 2.0 / 4.0
    n = np.arange(51)
    weights = {k * mu0**2: w for k, w in zip(n, stats.binom.pmf(n, 50, 0.5))}
    expected = gdp_mixture_epsilon(1e-5, weights)
    assert out["epsilon"] == pytest.approx(expected, rel=0.01)
    expected_count = gaussian.gdp_epsilon(1e-5, mu=mu0 * math.sqrt(25))
    assert out["epsilon"] > expected_count
    assert out["status"] == "proven" and "who took part" in out["adversary"]


def test_account_locks_without_counts_is_a_bound_before_the_run(capsys):
    # LOCKS before a run: each round w.p. q1 a noisy norm (mu_n = 1/s_n), w.p.
    # q1*max_p2 also the update (mu_g = 1/s_g), all visible. Independent value:
    # the multinomial mixture over (norm-only, both) counts of the GDP curve of
    # mu^2 = a mu_n^2 + b (mu_n^2 + mu_g^2) (tolerance 1%).
    q1, p2, sg, ratio, rounds = 0.1, 0.5, 1.0, 4.0, 40
    out = run_json(
        capsys,
        "account",
        "locks",
        "--q1",
        str(q1),
        "--max-p2",
        str(p2),
        "--noise-multiplier",
        str(sg),
        "--norm-noise-ratio",
        str(ratio),
        "--rounds",
        str(rounds),
    )
    mn2, mc2 = 1 / (ratio * sg) ** 2, 1 / (ratio * sg) ** 2 + 1 / sg**2
    probs = [1 - q1, q1 * (1 - p2), q1 * p2]
    weights: dict[float, float] = {}
    for a in range(rounds + 1):
        for b in range(rounds + 1 - a):
            w = stats.multinomial.pmf([rounds - a - b, a, b], rounds, probs)
            m2 = a * mn2 + b * mc2
            weights[m2] = weights.get(m2, 0.0) + w
    assert out["epsilon"] == pytest.approx(gdp_mixture_epsilon(1e-5, weights), rel=0.01)
    # a user-given realised count is labelled as a statement about that run
    assert (
        main(
            [
                "account",
                "locks",
                "--q1",
                "0.1",
                "--noise-multiplier",
                "1",
                "--rounds",
                "40",
                "--norm-rounds",
                "6",
                "--update-rounds",
                "3",
            ]
        )
        == 0
    )
    text = capsys.readouterr().out
    assert "server (realised)" in text and "a statement about that run" in text


# -- item 3: LOCKS runs guard the server's view of every client -------------------
def test_locks_run_keeps_every_clients_server_view_within_the_budget(tmp_path):
    # Independent check from the ledger's own record of who sent what: each
    # client's server-view epsilon is the GDP curve of mu^2 = N1/s_n^2 +
    # N2/s_g^2 (exact Gaussian composition); every one must be within the
    # budget, and the run prints both adversaries' views.
    pytest.importorskip("torch")
    from dpfl.experiments import load_config, run

    cfg = load_config(
        PRESETS / "locks-digits.yaml",
        [
            f"output_dir={tmp_path}",
            "rounds=60",
            "eval_every=30",
            "privacy.noise_multiplier=1.0",
            "privacy.epsilon=8.0",
        ],
    )
    res = run(cfg, progress=False)
    ledger = PrivacyLedger.load(cfg.run_dir / "ledger.json")
    sn, sg = 4.0, 1.0
    counts: dict[int, list[int]] = {}
    for entry in ledger.entries:
        for k in entry.participants:
            c = counts.setdefault(k, [0, 0])
            c[0] += 1
            c[1] += k in entry.extra["second_stage"]
    worst = max(
        gaussian.gdp_epsilon(1e-5, mu=math.sqrt(a / sn**2 + b / sg**2))
        for a, b in counts.values()
    )
    assert worst <= 8.0
    assert res.epsilon == pytest.approx(worst, rel=1e-9)
    assert res.stopped in ("budget", "completed")
    g = res.guarantee
    assert g["analysis"] == "server" and set(g["analyses"]) == {"server", "observer"}
    assert g["neighbouring"].startswith("zero-out")


# -- item 4: invalid analyses are refused, or labelled with the proven one -------
def test_runs_refuse_unproven_analyses_and_label_them_when_opted_in(tmp_path, capsys):
    pytest.importorskip("torch")
    cfg = str(PRESET_DIR / "digits-dsgd-rp.yaml")
    common = [
        "--no-progress",
        "--set",
        f"output_dir={tmp_path}",
        "--set",
        "rounds=4",
        "--set",
        "eval_every=2",
        "--set",
        "privacy.noise_multiplier=2.0",
    ]
    for analysis in ("paper", "cs"):
        status = main(["train", cfg, *common, "--set", f"privacy.analysis={analysis}"])
        err = capsys.readouterr().err.strip().splitlines()
        assert status == 2
        assert len(err) == 1 and "privacy.analysis" in err[0]
        assert "allow_unproven" in err[0]
    status = main(
        [
            "train",
            cfg,
            *common,
            "--set",
            "privacy.analysis=paper",
            "--set",
            "privacy.allow_unproven=true",
            "--set",
            "name=paper",
        ]
    )
    out = capsys.readouterr().out
    assert status == 0
    assert "NOT A PROVEN BOUND" in out and "proven: epsilon" in out
    run_dir = tmp_path / "paper"
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").open()]
    evaluated = [r for r in rows if "epsilon" in r]
    assert evaluated and all(
        r["epsilon_status"] == "invalid" and r["epsilon_proven"] > 0 for r in evaluated
    )
    g = json.loads((run_dir / "guarantee.json").read_text())
    assert g["status"] == "invalid" and g["proven"]["analysis"] == "sound"
    ledger = json.loads((run_dir / "ledger.json").read_text())
    assert ledger["summary"]["status"] == "invalid" and "proven" in ledger["summary"]


def test_median_clipping_needs_the_opt_in(tmp_path):
    pytest.importorskip("torch")
    from dpfl.experiments import load_config, run
    from dpfl.experiments.config import ConfigError

    overrides = [
        f"output_dir={tmp_path}",
        "rounds=2",
        "algorithm.params.clipping=median",
    ]
    with pytest.raises(ConfigError, match="median clipping"):
        run(load_config(PRESETS / "dp-fedavg-digits.yaml", overrides), progress=False)
    res = run(
        load_config(
            PRESETS / "dp-fedavg-digits.yaml",
            [*overrides, "privacy.allow_unproven=true"],
        ),
        progress=False,
    )
    assert res.rounds_completed == 2


# -- items 5 and 6: every analysis has a status; every event its true terms ------
_EVENTS = {
    "Gaussian": ev.Gaussian(1.0),
    "PoissonSampled": ev.PoissonSampled(0.1, ev.Gaussian(1.0)),
    "RecordPoisson": ev.RecordPoisson(0.1, 5, ev.Gaussian(1.0)),
    "ClientPoisson": ev.ClientPoisson(0.1, ev.Gaussian(1.0)),
    "FixedCohort": ev.FixedCohort(5, 10, ev.Gaussian(1.0)),
    "WithoutReplacement": ev.WithoutReplacement(5, 10, ev.Gaussian(1.0)),
    "CheckIn": ev.CheckIn(0.5, ev.Gaussian(1.0)),
    "TwoStage": ev.TwoStage(0.5, 2, 1.0, ev.Gaussian(4.0), ev.Gaussian(1.0)),
    "SelfComposed": ev.SelfComposed(ev.FixedCohort(5, 10, ev.Gaussian(1.0)), 3),
}
_TERMS = {  # (unit, start of the neighbouring relation) as each scheme is defined
    "Gaussian": ("one clipped contribution", "add/remove"),
    "PoissonSampled": ("one clipped contribution", "add/remove"),
    "RecordPoisson": ("record", "add/remove"),
    "ClientPoisson": ("client", "add/remove"),
    "FixedCohort": ("client", "replace-one"),
    "WithoutReplacement": ("record", "replace-one"),
    "CheckIn": ("record", "replace-one"),
    "TwoStage": ("client", "zero-out"),
    "SelfComposed": ("client", "replace-one"),
}


def test_every_event_type_reports_its_own_terms():
    # Enumerates every registered event type: none may fall back to a generic
    # "record, add/remove" statement.
    registered = {
        name
        for name, cls in ev._REGISTRY.items()
        if cls.__module__ == ev.__name__ and name != "Event"
    }
    assert registered == set(_EVENTS)
    rp = ev.ClientPoisson(0.1, ev.RecordPoisson(0.5, 4, ev.Gaussian(1.0)))
    cases = {**_EVENTS, "random participation": rp}
    for name, event in cases.items():
        unit, relation = _TERMS.get(name, ("record", "add/remove"))
        for a in schemes.scheme_of(event).analyses:
            d = schemes.describe(event, a.name)
            assert d["unit"].startswith(unit), (name, d)
            if a.neighbouring is None:
                assert d["neighbouring"].startswith(relation), (name, d)
            assert d["adversary"] and d["status"] in schemes.STATUSES
    # the relation follows the analysis where a paper reads the scheme otherwise
    d = schemes.describe(_EVENTS["FixedCohort"], "paper-pld")
    assert d["neighbouring"].startswith("add/remove") and d["status"] == "invalid"


@pytest.mark.parametrize(
    "argv",
    [
        [
            "random-participation",
            "--p",
            "0.1",
            "--q",
            "0.5",
            "--records-per-client",
            "4",
            "--noise-multiplier",
            "1.0",
            "--rounds",
            "3",
        ],
        [
            "dp-fedavg",
            "--clients",
            "100",
            "--cohort",
            "10",
            "--noise-multiplier",
            "1.0",
            "--rounds",
            "3",
        ],
        [
            "prifedsync",
            "--noise-multiplier",
            "1.0",
            "--batch-size",
            "8",
            "--records-per-client",
            "60",
            "--local-steps",
            "2",
            "--rounds",
            "3",
        ],
        ["ms-pafl", "--rounds", "3"],
        ["locks", "--q1", "0.2", "--noise-multiplier", "1.0", "--rounds", "3"],
        ["gaussian", "--noise-multiplier", "1.0"],
    ],
)
def test_account_json_carries_terms_and_status(capsys, argv):
    out = run_json(capsys, "account", *argv)
    for key in ("unit", "neighbouring", "adversary", "analysis", "status"):
        assert out[key], key
    assert out["status"] == "proven"  # every default is a proven analysis
    expected_unit = {
        "random-participation": "record",
        "dp-fedavg": "client",
        "prifedsync": "record",
        "ms-pafl": "record",
        "locks": "client",
        "gaussian": "one clipped contribution",
    }[argv[0]]
    assert out["unit"].startswith(expected_unit)


def test_statuses_of_random_participation_and_readme():
    scheme = schemes.RANDOM_PARTICIPATION
    status = {a.name: a.status for a in scheme.analyses}
    assert scheme.default == "sound"
    assert status == {
        "sound": "proven",
        "wcs": "proven",
        "ols": "proven",
        "paper": "invalid",
        "cs": "invalid",
    }
    readme = (ROOT / "README.md").read_text()
    assert "two-sided conditional pair" in readme and "no lemma" in readme


# -- item 7: one sensitivity convention -------------------------------------------
def test_one_sensitivity_convention():
    # The same mechanism built three ways prices the same: a uniform cohort of
    # m of K under replace-one (FixedCohort, sound) is the uniform subset of a
    # WithoutReplacement event; a Gaussian of sensitivity s is one of noise
    # sigma/s; a participant of a check-in pays the replace-one Gaussian. The
    # independent value for the cohort is dp_accounting's RDP-free closed form
    # of C_p(G_mu) with mu = 2/sigma (subsampled.exact_epsilon composes it), 1%.
    from dpfl.accounting import subsampled

    cohort = Accountant().compose(ev.FixedCohort(20, 100, ev.Gaussian(2.0)), 10)
    subset = Accountant().compose(ev.WithoutReplacement(20, 100, ev.Gaussian(2.0)), 10)
    assert cohort.epsilon(1e-5) == subset.epsilon(1e-5)
    ref = subsampled.exact_epsilon(
        1e-5,
        noise_multiplier=1.0,  # fdp's convention: one step is G_{1/sigma} = G_{2/2}
        batch_size=20,
        records_per_client=100,
        local_steps=1,
        rounds=10,
    )
    assert cohort.epsilon(1e-5).upper == pytest.approx(ref.upper, rel=0.01)
    a = Accountant().compose(ev.Gaussian(3.0, sensitivity=1.5), 4).epsilon(1e-5)
    b = Accountant().compose(ev.Gaussian(2.0), 4).epsilon(1e-5)
    assert a.upper == pytest.approx(b.upper, rel=1e-12)
    cost = costs.charges(ev.CheckIn(0.5, ev.Gaussian(3.0)), (1,))[1]
    assert cost == ev.Gaussian(3.0, sensitivity=2.0)
    assert "do not pass 2 for replace-one" in " ".join(ev.Gaussian.__doc__.split())


# -- item 8: one calibrator, for every algorithm, fast, or a clear answer -----------
def test_calibrator_finds_its_bracket_for_a_fixed_cohort():
    # Geyer's digits preset: 56 rounds of m = 50 of K = 100 at (8, 1e-3) under
    # the sound WOR analysis needs sigma near 3.97 (the preset's sigma = 4
    # spends 7.92). The old fixed bracket overflowed at sigma = 0.05.
    sigma = calibrate_noise_multiplier(
        lambda s: ev.FixedCohort(50, 100, ev.Gaussian(s)),
        epsilon=8.0,
        delta=1e-3,
        rounds=56,
    )
    assert 3.9 < sigma < 4.0
    acc = Accountant(tolerance=0.005).compose(
        ev.FixedCohort(50, 100, ev.Gaussian(sigma)), 56
    )
    assert acc.epsilon(1e-3).upper <= 8.0


def test_infeasible_target_gets_one_line_that_says_what_is_needed():
    with pytest.raises(DpflError) as info:
        calibrate_noise_multiplier(
            lambda s: ev.Gaussian(s), epsilon=1e-9, delta=1e-10, rounds=10**6
        )
    msg = str(info.value)
    assert "\n" not in msg and "noise_multiplier" in msg and "larger epsilon" in msg


@pytest.mark.parametrize(
    "preset",
    [
        pytest.param("dp-fedavg-digits", marks=pytest.mark.slow),
        "ms-pafl-tabular",
        pytest.param("prifedsync-digits", marks=pytest.mark.slow),
        "locks-digits",
    ],
)
def test_every_preset_calibrates_and_finishes_within_the_budget(tmp_path, preset):
    # The acceptance command: the preset with privacy.noise_multiplier=null (a
    # shorter run) calibrates sigma and finishes with epsilon <= the budget.
    pytest.importorskip("torch")
    from dpfl.experiments import load_config, run

    cfg = load_config(
        PRESETS / f"{preset}.yaml",
        [
            f"output_dir={tmp_path}",
            "rounds=8",
            "eval_every=8",
            "privacy.noise_multiplier=null",
        ],
    )
    res = run(cfg, progress=False)
    assert res.config.privacy.noise_multiplier > 0
    assert res.epsilon <= cfg.privacy.epsilon
    assert res.rounds_completed == 8


@pytest.mark.parametrize(
    "scheme",
    [
        pytest.param("prifedsync", marks=pytest.mark.slow),
        pytest.param("ms-pafl", marks=pytest.mark.slow),
        "locks",
    ],
)
def test_calibrate_covers_the_schemes_it_lacked(capsys, scheme):
    argv = {
        "prifedsync": [
            "--batch-size",
            "8",
            "--records-per-client",
            "60",
            "--local-steps",
            "2",
            "--rounds",
            "5",
        ],
        "ms-pafl": ["--probability", "0.5", "--rounds", "20"],
        "locks": ["--q1", "0.2", "--rounds", "20"],
    }[scheme]
    out = run_json(
        capsys, "calibrate", scheme, *argv, "--epsilon", "4", "--delta", "1e-5"
    )
    assert out["noise_multiplier"] > 0 and out["status"] == "proven"


# -- item 9: unsafe settings are refused ----------------------------------------------
def test_unknown_analysis_names_are_refused():
    with pytest.raises(InvalidParameterError, match="analysis must be one of"):
        Accountant("typo")
    with pytest.raises(InvalidParameterError, match="wcs"):
        PrivacyLedger(analysis="pld")
    with pytest.raises(DpflError, match="for fixed-size cohort"):
        Accountant("wcs").compose(_EVENTS["FixedCohort"]).epsilon(1e-5)


def test_large_delta_and_silent_non_private_runs_are_refused(tmp_path, capsys):
    pytest.importorskip("torch")
    from dpfl.experiments import load_config, run
    from dpfl.experiments.config import ConfigError

    base = [f"output_dir={tmp_path}", "rounds=3", "eval_every=3"]
    with pytest.raises(ConfigError, match=r"privacy.delta must be < 1/n"):
        run(load_config(PRESETS / "ms-pafl-tabular.yaml", [*base, "privacy.delta=0.5"]))
    res = run(
        load_config(
            PRESETS / "ms-pafl-tabular.yaml",
            [*base, "privacy.delta=0.5", "privacy.allow_large_delta=true", "name=big"],
        ),
        progress=False,
    )
    assert res.rounds_completed == 3
    # with a budget, a missing sigma means "calibrate": MS-PAFL used to train
    # without noise here
    res = run(
        load_config(
            PRESETS / "ms-pafl-tabular.yaml",
            [*base, "privacy.noise_multiplier=null", "name=calibrated"],
        ),
        progress=False,
    )
    assert res.config.privacy.noise_multiplier > 0 and res.epsilon > 0
    # a non-private run is asked for with 0 and labelled non-private
    res = run(
        load_config(
            PRESETS / "ms-pafl-tabular.yaml",
            [*base, "privacy.noise_multiplier=0", "privacy.epsilon=.inf", "name=open"],
        ),
        progress=False,
    )
    assert res.epsilon is None and res.guarantee == {
        "private": False,
        "note": "no noise was added: the run has no privacy guarantee",
    }
    rows = [json.loads(line) for line in (tmp_path / "open" / "metrics.jsonl").open()]
    assert rows[-1]["private"] is False and rows[-1]["epsilon"] is None
    with pytest.raises(ConfigError, match="privacy.noise_multiplier"):
        load_config(
            PRESETS / "dp-fedavg-digits.yaml", ["algorithm.params.noise_multiplier=1"]
        )


# -- item 10: "epsilon spent" is the worst-off unit's, with its terms --------------
@pytest.mark.slow  # .ci/run runs it (-m slow)
def test_run_epsilon_is_the_worst_off_units(tmp_path, capsys):
    pytest.importorskip("torch")
    from dpfl.experiments import load_config, run

    cfg = load_config(
        PRESETS / "prifedsync-digits.yaml",
        [f"output_dir={tmp_path}", "rounds=6", "eval_every=6"],
    )
    res = run(cfg, progress=False)
    ledger = PrivacyLedger.load(cfg.run_dir / "ledger.json")
    per_client = [
        ledger.client_epsilon(k, 1e-5).upper for k in range(cfg.data.num_clients)
    ]
    assert res.epsilon == pytest.approx(max(per_client), rel=1e-12)
    for key in ("unit", "neighbouring", "adversary", "delta", "analysis", "status"):
        assert key in res.guarantee
    # runs at different delta do not share one epsilon axis without saying so
    other = load_config(
        PRESETS / "prifedsync-digits.yaml",
        [
            f"output_dir={tmp_path}",
            "rounds=6",
            "eval_every=6",
            "privacy.delta=1e-6",
            "name=other",
        ],
    )
    run(other, progress=False)
    assert (
        main(
            [
                "plot",
                str(cfg.run_dir),
                str(other.run_dir),
                "--out",
                str(tmp_path / "both.png"),
            ]
        )
        == 0
    )
    assert "not on one scale" in capsys.readouterr().err


# -- item 12: the default is the tightest proven analysis --------------------------
@pytest.mark.slow  # .ci/run runs it (-m slow)
def test_defaults_are_the_tightest_proven_analyses(capsys):
    # Geyer's example (K = 100, m = 50, 11 rounds, (8, 1e-3)): the WOR PLD needs
    # sigma 2.007 (the independent figure, 0.5%), the WOR RDP 3.396.
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
    )
    assert out["analysis"] == "sound" and out["status"] == "proven"
    assert out["noise_multiplier"] == pytest.approx(2.007, rel=5e-3)
    # For every scheme, no proven analysis the accountant prices beats the default.
    rp = ev.ClientPoisson(0.2, ev.RecordPoisson(0.5, 5, ev.Gaussian(1.5)))
    for event in (*_EVENTS.values(), rp):
        scheme = schemes.scheme_of(event)
        default = Accountant().compose(event, 5).epsilon(1e-5).upper
        for a in scheme.analyses:
            if not a.valid:
                continue
            try:
                other = Accountant(a.name).compose(event, 5).epsilon(1e-5).upper
            except DpflError:  # an RDP analysis: priced by dpfl.accounting.rdp
                continue
            assert default <= other * (1 + 0.02), (scheme.name, a.name)
