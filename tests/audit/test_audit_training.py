"""Training audits: the one-run bound, canaries in real runs, broken runs caught."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from scipy import stats

from dpfl.audit.canaries import canary_run
from dpfl.audit.onerun import one_run_epsilon, one_run_guesses, one_run_p_value
from dpfl.audit.training import audit_training
from dpfl.cli.main import main
from dpfl.data import get_dataset
from dpfl.errors import InvalidParameterError
from dpfl.models import build_model


# -------------------------------------------------------------- the one-run bound
def _p_value_by_definition(m, r, v, eps, delta):
    """Steinke, Nasr & Jagielski (2023), approximate DP, summed from pmfs."""
    p = math.exp(eps) / (1 + math.exp(eps))
    pmf = [stats.binom.pmf(k, r, p) for k in range(r + 1)]
    tail = sum(pmf[v:])
    best = 0.0
    for i in range(1, v + 1):
        window = sum(pmf[k] for k in range(v - i, v))
        best = max(best, window / i)
    return tail + 2 * m * delta * best


@pytest.mark.parametrize(
    ("m", "r", "v", "eps", "delta"),
    [(100, 40, 30, 1.0, 1e-4), (1000, 200, 190, 2.5, 1e-6), (50, 50, 25, 0.0, 1e-3)],
)
def test_one_run_p_value_matches_the_theorem_summed_directly(m, r, v, eps, delta):
    # Independent computation: plain pmf sums, loop over i (tolerance 1e-10 rel).
    expected = min(1.0, _p_value_by_definition(m, r, v, eps, delta))
    got = one_run_p_value(m, r, v, epsilon=eps, delta=delta)
    assert got == pytest.approx(expected, rel=1e-10, abs=1e-15)


@pytest.mark.parametrize(("eps", "delta"), [(1.0, 0.0), (2.0, 1e-5)])
def test_one_run_bound_is_valid_and_informative_on_randomized_response(eps, delta):
    # The (ε, δ) mechanism: each canary's bit S_i is revealed w.p. δ, otherwise
    # released by ε randomized response; guessing the release, the number of
    # correct guesses of m is Binomial(m, δ + (1 − δ) e^ε/(1 + e^ε)) exactly.
    # P[bound > ε] summed over that law must be <= 1 − confidence = 0.05, and
    # the bound must not be vacuous (it exceeds ε/2 with probability >= 0.5).
    m = 400
    p = delta + (1 - delta) * math.exp(eps) / (1 + math.exp(eps))
    vs = np.arange(m + 1)
    pmf = stats.binom.pmf(vs, m, p)
    keep = pmf > 1e-12
    bounds = np.array(
        [one_run_epsilon(m, m, int(v), delta=delta, confidence=0.95) for v in vs[keep]]
    )
    assert pmf[keep][bounds > eps].sum() <= 0.05
    assert pmf[keep][bounds > eps / 2].sum() >= 0.5


def test_one_run_bound_monte_carlo_of_randomized_response():
    # Monte Carlo of the same mechanism with guesses on top/bottom scores
    # (abstentions): 300 audits at 95%, a false alarm in <= 5% in expectation;
    # we allow the binomial 99.9% quantile of Bin(300, 0.05) (= 27).
    rng = np.random.default_rng(3)
    eps, m, alarms = 1.5, 300, 0
    p = math.exp(eps) / (1 + math.exp(eps))
    for _ in range(300):
        inc = rng.random(m) < 0.5
        keep = rng.random(m) < p
        out = np.where(keep, inc, ~inc)
        score = out + 0.1 * rng.standard_normal(m)
        res = one_run_guesses(score, inc, guess_in=100, guess_out=100, delta=0.0)
        alarms += res.epsilon > eps
    assert alarms <= stats.binom.ppf(0.999, 300, 0.05)


def test_one_run_rejects_inconsistent_counts():
    with pytest.raises(InvalidParameterError, match="correct <= guesses"):
        one_run_p_value(10, 5, 6, epsilon=1.0, delta=0.0)


# -------------------------------------------------------------- canaries in real runs
@pytest.fixture(scope="module")
def digits():
    return get_dataset("digits", num_clients=10, seed=0)


def _model(data):
    torch.manual_seed(0)
    return build_model("mlp", input_shape=data.input_shape, num_classes=10)


def test_client_canaries_see_the_privatizers_real_noise(digits):
    # Fixed cohort of every client: out canaries send −C e_j, in ones C e_j; after
    # the real clients' contribution is subtracted, coordinate j holds ±1 plus the
    # run's N(0, σ²) noise (units of C). 1000 canaries × 2 rounds: the mean of
    # each side within 5 standard errors, the std within 5%.
    inc = np.arange(1000) % 2 == 0
    run = canary_run(
        "dp-fedavg",
        {"cohort_size": 1010, "clip": 1.0},
        digits,
        noise_multiplier=2.0,
        model=_model,
        canaries=1000,
        included=inc,
        rounds=2,
        delta=1e-5,
        seed=0,
    )
    y = run.observations
    assert y.shape == (1000, 2) and run.rate == 1.0 and run.out_value == -1.0
    se = 2.0 / math.sqrt(1000)
    assert abs(y[inc].mean() - 1.0) < 5 * se
    assert abs(y[~inc].mean() + 1.0) < 5 * se
    assert np.concatenate([y[inc] - 1, y[~inc] + 1]).std() == pytest.approx(2, rel=0.05)


def test_gradient_canaries_are_sampled_by_the_runs_own_sampler(digits):
    # DP-DSGD, p = q = 0.5: a canary record is drawn w.p. pq = 0.25 a round; in
    # canaries average 0.25, out ones 0, noise std σ = 1 (5 standard errors).
    inc = np.arange(1000) % 2 == 0
    run = canary_run(
        "dsgd-rp",
        {"participation_probability": 0.5, "record_probability": 0.5, "clip": 1.0},
        digits,
        noise_multiplier=1.0,
        model=_model,
        canaries=1000,
        included=inc,
        rounds=4,
        delta=1e-5,
        seed=1,
    )
    y = run.observations
    assert run.rate == 0.25 and run.out_value == 0.0
    se = math.sqrt(1 + 0.25 * 0.75) / math.sqrt(2000)
    assert abs(y[inc].mean() - 0.25) < 5 * se
    assert abs(y[~inc].mean()) < 5 * se
    assert y[~inc].std() == pytest.approx(1.0, rel=0.05)


AUDIT = {
    "noise_multiplier": 2.0,
    "model": _model,
    "canaries": 3000,
    "rounds": 2,
    "delta": 1e-5,
}


@pytest.mark.parametrize(
    ("protocol", "threat"),
    [("multi-run", "white-box"), ("one-run", "white-box"), ("one-run", "black-box")],
)
def test_a_correct_run_audits_below_its_reported_epsilon(digits, protocol, threat):
    # Soundness at 95%: each audit's bound exceeds the truth with probability
    # <= 5%, and the reported ε (6.3 here) is the exact ε of this Gaussian
    # release, so a bound above it would be a bug (false alarm <= 5% per case;
    # the seeds are fixed). Informative: white-box reaches a third of it.
    res = audit_training(
        "dp-fedavg",
        {"cohort_size": 3010, "clip": 1.0},
        digits,
        protocol=protocol,
        threat=threat,
        **AUDIT,
    )
    assert 0 <= res.epsilon <= res.reported_epsilon
    assert res.ratio == pytest.approx(res.epsilon / res.reported_epsilon)
    if threat == "white-box":
        assert res.epsilon > res.reported_epsilon / 3


def test_an_unclipped_canary_is_caught(digits):
    # A client whose update is left unclipped (norm 4C instead of C): the
    # audit's bound exceeds the reported ε, which is then refuted.
    res = audit_training(
        "dp-fedavg",
        {"cohort_size": 3010, "clip": 1.0},
        digits,
        canary_norm=4.0,
        **{**AUDIT, "noise_multiplier": 4.0},
    )
    assert res.epsilon > res.reported_epsilon


def test_noise_drawn_at_the_wrong_scale_is_caught(digits, monkeypatch):
    # The privatizer draws a quarter of the noise it claims (its scale bug);
    # the ledger still prices σ = 4, the audit refutes it.
    import dpfl.sim.algorithms.dp_fedavg as fedavg

    class Quarter(fedavg.CentralGaussian):
        def __init__(self, *, noise_multiplier, clip):
            super().__init__(noise_multiplier=noise_multiplier / 4, clip=clip)

    monkeypatch.setattr(fedavg, "CentralGaussian", Quarter)
    res = audit_training(
        "dp-fedavg",
        {"cohort_size": 3010, "clip": 1.0},
        digits,
        **{**AUDIT, "noise_multiplier": 4.0},
    )
    assert res.epsilon > res.reported_epsilon


def test_white_box_refuses_a_fixed_cohort_of_some_clients(digits):
    # The other clients drawn would reveal whether the canary was.
    with pytest.raises(InvalidParameterError, match="poisson"):
        audit_training("dp-fedavg", {"cohort_size": 50, "clip": 1.0}, digits, **AUDIT)


def test_black_box_multi_run_is_refused(digits):
    with pytest.raises(InvalidParameterError, match="one-run"):
        audit_training(
            "dp-fedavg",
            {"cohort_size": 3010, "clip": 1.0},
            digits,
            threat="black-box",
            **AUDIT,
        )


# -------------------------------------------------------------- the command
def test_the_training_audit_command(capsys, tmp_path):
    argv = ["audit", "dp-fedavg", "--noise-multiplier", "2", "--canaries", "500"]
    argv += ["--clients", "10", "--rounds", "1", "--json", "--plot"]
    assert main([*argv, str(tmp_path / "fig")]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["algorithm"] == "dp-fedavg" and out["level"] == "client"
    assert 0 <= out["epsilon_lower_bound"] <= out["epsilon_upper_bound"]
    assert (tmp_path / "fig.png").stat().st_size > 0
    assert (tmp_path / "fig.pdf").stat().st_size > 0
    argv = ["audit", "dp-dsgd", "--noise-multiplier", "1", "--canaries", "300"]
    argv += ["--clients", "10", "--rounds", "1", "--protocol", "one-run", "--json"]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["level"] == "record" and out["rate"] == 0.25
