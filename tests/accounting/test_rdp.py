"""Tests for dpfl.accounting.rdp (client-level DP-FedAvg and LOCKS)."""

from __future__ import annotations

import logging
import math
import subprocess
import sys
import warnings

import mpmath
import numpy as np
import pytest
from dp_accounting import dp_event
from dp_accounting.privacy_accountant import NeighboringRelation
from dp_accounting.rdp import rdp_privacy_accountant

from dpfl.accounting import rdp
from dpfl.errors import InvalidParameterError

GEYER = dict(clients=100, cohort_sizes=50, rounds=11)


def _gdp_delta_mp(eps: float, mu: float) -> float:
    """μ-GDP δ(ε) in 40-digit mpmath (DRS Cor. 2.13), an independent witness."""
    mpmath.mp.dps = 40
    e, m = mpmath.mpf(eps), mpmath.mpf(mu)
    return float(
        mpmath.ncdf(-e / m + m / 2) - mpmath.e**e * mpmath.ncdf(-e / m - m / 2)
    )


# --- DP-FedAvg: docs/analyses.md example --------------------------------------------
@pytest.mark.parametrize(
    "analysis, sigma",
    [("paper-rdp", 1.081), ("paper-pld", 0.983), ("sound-rdp", 3.396)],
)
def test_geyer_example_brackets_spec_sigma(analysis, sigma):
    # Geyer et al.'s example, K = 100, m = 50, 11 rounds, ε = 8, δ = 1e-3, needs
    # σ >= 1.081 (Poisson reading, RDP with the improved conversion), 0.983
    # (Poisson reading, PLD), 3.396 (WOR/replace-one RDP), values computed
    # independently with dp_accounting's RdpAccountant / PLDAccountant.
    # Tolerance ±0.5% on σ: ε(δ) must exceed 8 at 0.995 σ and be below 8 at
    # 1.005 σ.
    def eps_at(z):
        return rdp.dp_fedavg_epsilon(
            delta=1e-3, noise_multipliers=z, analysis=analysis, **GEYER
        )

    assert eps_at(0.995 * sigma) > 8.0
    assert eps_at(1.005 * sigma) < 8.0


def _abadi_delta(epsilon, q, sigma, rounds, moments=32):
    """Abadi et al.'s moments accountant, computed here from its closed form.

    For an integer moment λ the log moment of the Poisson-subsampled Gaussian
    is α(λ) = log Σ_k C(λ+1, k) (1-q)^(λ+1-k) q^k exp((k² - k)/(2σ²))
    (Mironov, Talwar & Zhang 2019, Sec. 3.3), in 40-digit mpmath; T rounds
    add up, and δ = min over λ = 1..32 of exp(T α(λ) − λ ε) (Abadi et al.
    2016, Thm 2).
    """
    mpmath.mp.dps = 40
    best = mpmath.mpf(1)
    for lam in range(1, moments + 1):
        a = lam + 1
        total = mpmath.fsum(
            mpmath.binomial(a, k)
            * (1 - mpmath.mpf(q)) ** (a - k)
            * mpmath.mpf(q) ** k
            * mpmath.exp(mpmath.mpf(k * k - k) / (2 * mpmath.mpf(sigma) ** 2))
            for k in range(a + 1)
        )
        best = min(best, mpmath.exp(rounds * mpmath.log(total) - lam * epsilon))
    return float(best)


def test_paper_is_abadi_rule_and_stops_geyer_example_at_round_9():
    # The paper's stop rule (Geyer et al. 2017, Alg. 1) uses Abadi et al.'s
    # conversion: at σ = 1.081, K = 100, m = 50, ε = 8, Q = 1e-3 it stops at
    # round 9 (δ after 9 rounds passes Q), where the improved RDP conversion
    # ("paper-rdp") stops at 12. Witness: the closed-form moments above;
    # tolerance 1e-6 relative on δ.
    kw = dict(clients=100, cohort_sizes=50, noise_multipliers=1.081)
    for t in (8, 9):
        got = rdp.dp_fedavg_delta(epsilon=8.0, rounds=t, analysis="paper", **kw)
        assert got == pytest.approx(_abadi_delta(8.0, 0.5, 1.081, t), rel=1e-6)
    assert _abadi_delta(8.0, 0.5, 1.081, 8) <= 1e-3 < _abadi_delta(8.0, 0.5, 1.081, 9)
    stop = dict(epsilon=8.0, threshold=1e-3, max_rounds=50, **kw)
    assert rdp.dp_fedavg_stop_round(analysis="paper", **stop) == 9
    assert rdp.dp_fedavg_stop_round(analysis="paper-rdp", **stop) == 12


def test_sound_pld_is_tighter_than_sound_rdp_but_above_poisson():
    # Measured (notes/rdp.md): the exact C_{1/2}(G_{2/σ})^{⊗11} needs σ = 2.007
    # for ε = 8 while WBK19 RDP needs σ = 3.396; both valid for WOR/replace-one.
    # Ordering check (inequalities): pld (Poisson) <= sound-pld <= sound (RDP).
    kw = dict(delta=1e-3, noise_multipliers=2.05, **GEYER)
    poisson = rdp.dp_fedavg_epsilon(analysis="paper-pld", **kw)
    exact_wor = rdp.dp_fedavg_epsilon(analysis="sound", **kw)
    rdp_wor = rdp.dp_fedavg_epsilon(analysis="sound-rdp", **kw)
    assert poisson < exact_wor < rdp_wor
    assert exact_wor < 8.0 < rdp_wor


def test_sound_pld_full_cohort_is_gaussian():
    # m = K: no sampling, replace-one sensitivity 2S, so T rounds are exactly
    # G_{2 sqrt(T)/σ}; witness = mpmath GDP δ(ε), from above within 1e-3 in ε.
    eps = rdp.dp_fedavg_epsilon(
        delta=1e-5,
        clients=20,
        cohort_sizes=20,
        noise_multipliers=4.0,
        rounds=9,
        analysis="sound",
    )
    mu = 2 * 3 / 4.0
    assert _gdp_delta_mp(eps, mu) <= 1e-5 * (1 + 1e-6)
    assert _gdp_delta_mp(eps * 0.999, mu) > 1e-5


@pytest.mark.slow  # default run under 4 minutes; .ci/run runs it (-m slow)
def test_heterogeneous_schedule_is_sum_of_round_rdp():
    # Independent composition: one dp_accounting accountant per round, RDP
    # vectors summed by hand, δ by dp_accounting's compute_delta; rel 1e-12.
    ms, zs = [10, 20, 30, 20], [1.0, 1.5, 2.0, 1.5]
    orders = list(rdp._ORDERS)
    total = np.zeros(len(orders))
    for m, z in zip(ms, zs):
        acc = rdp_privacy_accountant.RdpAccountant(orders)
        acc.compose(
            dp_event.PoissonSampledDpEvent(m / 100, dp_event.GaussianDpEvent(z))
        )
        total += acc.rdp
    expected = rdp_privacy_accountant.compute_delta(orders, total, 4.0)[0]
    got = rdp.dp_fedavg_delta(
        epsilon=4.0,
        clients=100,
        cohort_sizes=ms,
        noise_multipliers=zs,
        analysis="paper-rdp",
    )
    assert got == pytest.approx(expected, rel=1e-12)
    # Sound analysis: same with WOR / replace-one at multiplier σ/2.
    total = np.zeros(len(orders))
    for m, z in zip(ms, zs):
        acc = rdp_privacy_accountant.RdpAccountant(
            orders, NeighboringRelation.REPLACE_ONE
        )
        acc.compose(
            dp_event.SampledWithoutReplacementDpEvent(
                100, m, dp_event.GaussianDpEvent(z / 2)
            )
        )
        total += acc.rdp
    expected = rdp_privacy_accountant.compute_delta(orders, total, 4.0)[0]
    got = rdp.dp_fedavg_delta(
        epsilon=4.0,
        clients=100,
        cohort_sizes=ms,
        noise_multipliers=zs,
        analysis="sound-rdp",
    )
    assert got == pytest.approx(expected, rel=1e-12)


def test_homogeneous_sequence_equals_scalar_schedule():
    for analysis in ("paper", "paper-rdp", "paper-pld"):
        a = rdp.dp_fedavg_delta(
            epsilon=2.0,
            clients=100,
            cohort_sizes=[10] * 5,
            noise_multipliers=1.2,
            analysis=analysis,
        )
        b = rdp.dp_fedavg_delta(
            epsilon=2.0,
            clients=100,
            cohort_sizes=10,
            noise_multipliers=1.2,
            rounds=5,
            analysis=analysis,
        )
        assert a == pytest.approx(b, rel=1e-9)


def test_schedule_validation():
    with pytest.raises(InvalidParameterError, match="rounds must be given"):
        rdp.dp_fedavg_delta(epsilon=1, clients=10, cohort_sizes=5, noise_multipliers=1)
    with pytest.raises(InvalidParameterError, match="disagree"):
        rdp.dp_fedavg_delta(
            epsilon=1, clients=10, cohort_sizes=[5, 5], noise_multipliers=[1.0]
        )
    with pytest.raises(InvalidParameterError, match="<= clients"):
        rdp.dp_fedavg_delta(
            epsilon=1, clients=10, cohort_sizes=11, noise_multipliers=1, rounds=2
        )
    with pytest.raises(InvalidParameterError, match="analysis"):
        rdp.dp_fedavg_delta(
            epsilon=1,
            clients=10,
            cohort_sizes=5,
            noise_multipliers=1,
            rounds=2,
            analysis="tight",
        )


def test_stop_round_matches_delta_and_is_monotone_in_sigma():
    kw = dict(
        epsilon=8.0,
        threshold=1e-3,
        clients=100,
        cohort_sizes=50,
        max_rounds=400,
        analysis="paper-rdp",
    )
    stops = [
        rdp.dp_fedavg_stop_round(noise_multipliers=z, **kw)
        for z in (0.8, 1.0, 1.2, 1.5, 2.0)
    ]
    assert all(s is not None for s in stops)
    assert stops == sorted(stops) and stops[0] < stops[-1]
    # Definition: δ after t-1 rounds <= Q < δ after t rounds.
    t = stops[1]
    one = dict(clients=100, cohort_sizes=50, noise_multipliers=1.0)
    before = rdp.dp_fedavg_delta(epsilon=8.0, rounds=t - 1, analysis="paper-rdp", **one)
    after = rdp.dp_fedavg_delta(epsilon=8.0, rounds=t, analysis="paper-rdp", **one)
    assert before <= 1e-3 < after
    # Enough noise: never stops within max_rounds.
    assert (
        rdp.dp_fedavg_stop_round(noise_multipliers=50.0, **{**kw, "max_rounds": 20})
        is None
    )


def test_stop_round_pld_matches_delta():
    kw = dict(clients=100, cohort_sizes=50, noise_multipliers=1.2)
    t = rdp.dp_fedavg_stop_round(
        epsilon=8.0, threshold=1e-3, max_rounds=60, analysis="paper-pld", **kw
    )
    assert t is not None
    pld = dict(epsilon=8.0, analysis="paper-pld", **kw)
    assert rdp.dp_fedavg_delta(rounds=t - 1, **pld) <= 1e-3
    assert rdp.dp_fedavg_delta(rounds=t, **pld) > 1e-3
    # The tight PLD lets training run at least as long as RDP does.
    t_rdp = rdp.dp_fedavg_stop_round(
        epsilon=8.0, threshold=1e-3, max_rounds=60, analysis="paper-rdp", **kw
    )
    assert t >= t_rdp


@pytest.mark.slow  # default run under 4 minutes; .ci/run runs it (-m slow)
def test_no_warnings_or_absl_logs_leak(caplog):
    # q = 0.5 at small orders makes dp_accounting log convergence warnings.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with caplog.at_level(logging.WARNING, logger="absl"):
            rdp.dp_fedavg_epsilon(
                delta=1e-3,
                clients=100,
                cohort_sizes=50,
                noise_multipliers=0.31,
                rounds=3,
            )
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


# --- RDP -> DP and LOCKS -----------------------------------------------------
@pytest.mark.parametrize("rho", [0.01, 0.5, 3.0])
@pytest.mark.parametrize("delta", [1e-3, 1e-6])
def test_rdp_to_dp_gaussian_closed_form(rho, delta):
    # Mironov Prop. 3 on the Gaussian curve ρα: the continuous optimum is
    # ρ + 2 sqrt(ρ ln 1/δ) at α* = 1 + sqrt(ln(1/δ)/ρ); a grid can only be
    # above it, and a dense grid within 1e-6 relative.
    closed = rho + 2 * math.sqrt(rho * math.log(1 / delta))
    orders = np.linspace(1.001, 2000, 400_000)
    numeric = rdp.rdp_to_dp(orders, rho * orders, delta=delta)
    assert closed * (1 - 1e-12) <= numeric <= closed * (1 + 1e-6)
    improved = rdp.rdp_to_dp(orders, rho * orders, delta=delta, conversion="improved")
    assert improved <= numeric


def test_rdp_to_dp_validation():
    with pytest.raises(InvalidParameterError, match="equal length"):
        rdp.rdp_to_dp([2.0, 3.0], [0.1], delta=1e-5)
    with pytest.raises(InvalidParameterError, match="orders must be >= 1"):
        rdp.rdp_to_dp([0.5], [0.1], delta=1e-5)
    with pytest.raises(InvalidParameterError, match="conversion"):
        rdp.rdp_to_dp([2.0], [0.1], delta=1e-5, conversion="bs")


def test_locks_server_view_exact_composition():
    # μ = sqrt(N1/σ_n² + N2/σ_g²) (docs/analyses.md): 30/25 + 10/2.25 = 5.6444,
    # μ = 2.37580; rel 1e-12.  ε from the GDP curve checked in mpmath.
    out = rdp.locks_server_view(
        norm_noise_multiplier=5.0,
        update_noise_multiplier=1.5,
        norm_rounds=30,
        update_rounds=10,
        delta=1e-5,
    )
    mu = math.sqrt(30 / 25 + 10 / 2.25)
    assert out["mu"] == pytest.approx(mu, rel=1e-12)
    assert out["rho"] == pytest.approx(mu**2 / 2, rel=1e-12)
    assert _gdp_delta_mp(out["epsilon"], mu) == pytest.approx(1e-5, rel=1e-8)
    # RDP closed form vs numeric conversion on dp_accounting's composed RDP
    # (grid of orders): numeric >= closed form, within 1e-3 relative.
    assert out["epsilon_rdp_numeric"] >= out["epsilon_rdp"] * (1 - 1e-12)
    assert out["epsilon_rdp_numeric"] <= out["epsilon_rdp"] * (1 + 1e-3)
    # Exact GDP <= improved RDP conversion <= Mironov's.
    assert out["epsilon"] < out["epsilon_rdp_improved"] < out["epsilon_rdp"]
    # Replace-one doubles the update sensitivity.
    rep = rdp.locks_server_view(
        norm_noise_multiplier=5.0,
        update_noise_multiplier=1.5,
        norm_rounds=30,
        update_rounds=10,
        delta=1e-5,
        neighbouring="replace-one",
    )
    assert rep["mu"] == pytest.approx(math.sqrt(30 / 25 + 40 / 2.25), rel=1e-12)
    with pytest.raises(InvalidParameterError, match="subset"):
        rdp.locks_server_view(
            norm_noise_multiplier=5.0,
            update_noise_multiplier=1.5,
            norm_rounds=3,
            update_rounds=10,
            delta=1e-5,
        )


def test_rdp_module_does_not_import_torch():
    code = (
        "import sys, dpfl.accounting.rdp, dpfl.accounting.checkin, "
        "dpfl.accounting.composition; assert 'torch' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_geyer_table1_k100_eleven_rounds():
    # Geyer Table 1 (K = 100, Q = 1e-3, ε = 8): CR = 11, CC = 550 -> m = 50.  At
    # σ = 1.081 (the σ for which the Poisson-reading RDP with the improved
    # conversion allows 11 rounds), that rule stops before round 12, i.e. after
    # exactly 11 rounds; Abadi et al.'s own rule needs σ = 1.1932 for the same.
    t = rdp.dp_fedavg_stop_round(
        epsilon=8.0,
        threshold=1e-3,
        clients=100,
        cohort_sizes=50,
        noise_multipliers=1.081,
        max_rounds=50,
        analysis="paper-rdp",
    )
    assert t == 12
    t = rdp.dp_fedavg_stop_round(
        epsilon=8.0,
        threshold=1e-3,
        clients=100,
        cohort_sizes=50,
        noise_multipliers=1.1933,
        max_rounds=50,
        analysis="paper",
    )
    assert t == 12
