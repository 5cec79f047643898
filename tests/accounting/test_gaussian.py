"""Tests of dpfl.accounting.gaussian (analytic Gaussian mechanism and GDP)."""

import math
import warnings

import mpmath
import numpy as np
import pytest
from dp_accounting.pld import accountant as pld_accountant
from dp_accounting.pld import common as pld_common
from dp_accounting.pld import privacy_loss_distribution, privacy_loss_mechanism
from scipy import stats

from dpfl.accounting import gaussian
from dpfl.errors import InvalidParameterError


def _random_cases(n=24, seed=20240601):
    rng = np.random.default_rng(seed)
    sigmas = rng.uniform(0.3, 5.0, n)
    epsilons = rng.uniform(0.0, 8.0, n)
    return list(zip(sigmas.tolist(), epsilons.tolist()))


@pytest.mark.parametrize(("sigma", "epsilon"), _random_cases())
def test_delta_matches_dp_accounting_closed_form(sigma, epsilon):
    # Source: dp_accounting GaussianPrivacyLoss.get_delta_for_epsilon (its own
    # implementation of Balle-Wang Thm 8). Tolerance: 1e-9 relative (both closed
    # forms in double precision) or 1e-300 absolute where δ underflows.
    ref = privacy_loss_mechanism.GaussianPrivacyLoss(sigma).get_delta_for_epsilon(
        epsilon
    )
    ours = gaussian.delta_for_epsilon(epsilon, noise_multiplier=sigma)
    assert ours == pytest.approx(ref, rel=1e-9, abs=1e-300)


@pytest.mark.parametrize(("sigma", "epsilon"), _random_cases())
def test_delta_within_half_percent_of_dp_accounting_pld(sigma, epsilon):
    # Source: dp_accounting from_gaussian_mechanism (pessimistic connect-the-dots
    # PLD, h = 1e-4), an independent numerical route. Tolerance: 0.5% relative
    # where δ >= 1e-12, and the PLD (an upper bound) must not be below ours.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pld = privacy_loss_distribution.from_gaussian_mechanism(
            sigma, value_discretization_interval=1e-4
        )
    ref = float(pld.get_delta_for_epsilon(epsilon))
    ours = gaussian.delta_for_epsilon(epsilon, noise_multiplier=sigma)
    if ours >= 1e-12:
        assert ours == pytest.approx(ref, rel=5e-3)
    assert ref >= ours * (1 - 1e-9) - 1e-15


@pytest.mark.parametrize(
    ("mu", "epsilon"),
    [(1.0, 0.5), (1.0, 20.0), (1 / 0.3, 50.0), (0.2, 3.0), (4.0, 30.0), (2.0, -1.0)],
)
def test_delta_against_mpmath_high_precision(mu, epsilon):
    # Source: mpmath at 60 digits of Φ(μ/2 − ε/μ) − e^ε Φ(−μ/2 − ε/μ).
    # Tolerance: 1e-12 relative, including ε = 20..50 where δ ~ 1e-86..1e-41 and
    # the naive double-precision difference has no correct digit.
    mpmath.mp.dps = 60
    m, e = mpmath.mpf(mu), mpmath.mpf(epsilon)
    ref = mpmath.ncdf(m / 2 - e / m) - mpmath.exp(e) * mpmath.ncdf(-m / 2 - e / m)
    ours = gaussian.gdp_delta(epsilon, mu=mu)
    assert ours == pytest.approx(float(ref), rel=1e-12)


def test_large_epsilon_where_naive_formula_overflows():
    # At μ = 40, ε = 800 the naive formula needs e^800 (overflow: inf·Φ = inf, so
    # δ = −inf). Ours stays finite. Source: mpmath at 60 digits; tolerance 1e-12.
    mu, eps = 40.0, 800.0
    with np.errstate(over="ignore", invalid="ignore"):
        naive = stats.norm.cdf(mu / 2 - eps / mu) - np.exp(eps) * stats.norm.cdf(
            -mu / 2 - eps / mu
        )
    assert not np.isfinite(naive)
    mpmath.mp.dps = 60
    m, e = mpmath.mpf(mu), mpmath.mpf(eps)
    ref = mpmath.ncdf(m / 2 - e / m) - mpmath.exp(e) * mpmath.ncdf(-m / 2 - e / m)
    assert gaussian.gdp_delta(eps, mu=mu) == pytest.approx(float(ref), rel=1e-12)


def test_sensitivity_and_mu_identities():
    # Closed-form identities: δ depends on (σ, Δ) only through μ = Δ/σ;
    # δ(0) = TV(N(0,1), N(μ,1)) = 2Φ(μ/2) − 1. Tolerance 1e-15 absolute.
    d1 = gaussian.delta_for_epsilon(1.3, noise_multiplier=1.5, sensitivity=2.0)
    d2 = gaussian.delta_for_epsilon(1.3, noise_multiplier=0.75, sensitivity=1.0)
    d3 = gaussian.gdp_delta(1.3, mu=gaussian.mu_from_noise(noise_multiplier=0.75))
    assert d1 == pytest.approx(d2, abs=1e-15)
    assert d1 == pytest.approx(d3, abs=1e-15)
    for mu in (0.1, 1.0, 3.0):
        assert gaussian.gdp_delta(0.0, mu=mu) == pytest.approx(
            2 * stats.norm.cdf(mu / 2) - 1, abs=1e-15
        )
    assert gaussian.gdp_delta(0.7, mu=0.0) == 0.0


@pytest.mark.parametrize("sigma", [0.4, 1.0, 3.0])
@pytest.mark.parametrize("delta", [1e-3, 1e-6, 1e-10])
def test_epsilon_delta_round_trip(sigma, delta):
    # Round trip: δ(ε(δ)) = δ to 1e-9 relative, and ε(δ) is never too small.
    eps = gaussian.epsilon_for_delta(delta, noise_multiplier=sigma)
    back = gaussian.delta_for_epsilon(eps, noise_multiplier=sigma)
    assert back <= delta
    if eps > 0:
        assert back == pytest.approx(delta, rel=1e-9)
        # a slightly smaller ε must violate δ
        assert gaussian.delta_for_epsilon(eps * (1 - 1e-8), noise_multiplier=sigma) > (
            delta
        )


def test_epsilon_zero_when_already_private():
    # δ(0) = 2Φ(μ/2) − 1 = 0.0399 at μ = 0.1 < 0.05, so ε = 0 exactly.
    assert gaussian.epsilon_for_delta(0.05, noise_multiplier=10.0) == 0.0


@pytest.mark.parametrize(
    ("epsilon", "delta"), [(0.5, 1e-5), (1.0, 1e-5), (4.0, 1e-6), (10.0, 1e-8)]
)
def test_calibrate_analytic_is_smallest_and_matches_dp_accounting(epsilon, delta):
    # Source: dp_accounting pld.accountant.get_smallest_gaussian_noise (PLD-based,
    # an independent route). Tolerance 1e-3 relative (its PLD discretisation).
    sigma = gaussian.calibrate_analytic(epsilon=epsilon, delta=delta)
    assert gaussian.delta_for_epsilon(epsilon, noise_multiplier=sigma) <= delta
    assert (
        gaussian.delta_for_epsilon(epsilon, noise_multiplier=sigma * (1 - 1e-9)) > delta
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = pld_accountant.get_smallest_gaussian_noise(
            pld_common.DifferentialPrivacyParameters(epsilon, delta), num_queries=1
        )
    assert sigma == pytest.approx(ref, rel=1e-3)


def test_calibrate_analytic_published_value():
    # Source: Balle & Wang 2018 (Fig. 1 / text): for (ε, δ) = (1, 1e-5) the
    # analytic Gaussian needs σ ≈ 3.73 while the classic formula gives 4.84.
    # Tolerance: the printed 2 decimals (±0.005).
    sigma = gaussian.calibrate_analytic(epsilon=1.0, delta=1e-5)
    assert abs(sigma - 3.73) <= 0.005
    classic, warning = gaussian.classic_sigma(epsilon=0.999999, delta=1e-5)
    assert abs(classic - 4.84) <= 0.005
    assert warning is None


def test_classic_sigma_formula_and_warning():
    # Closed form sqrt(2 ln(1.25/δ)) Δ/ε (Dwork-Roth Thm 3.22), exact to 1e-15.
    sigma, warning = gaussian.classic_sigma(epsilon=0.5, delta=1e-6, sensitivity=2.0)
    assert sigma == pytest.approx(math.sqrt(2 * math.log(1.25e6)) * 2 / 0.5, rel=1e-15)
    assert warning is None
    sigma, warning = gaussian.classic_sigma(epsilon=1.0, delta=1e-5)
    assert isinstance(warning, str)
    assert "epsilon < 1" in warning
    # In its valid range the classic σ is (ε, δ)-DP, hence >= the analytic σ.
    for eps in (0.1, 0.5, 0.9):
        classic, _ = gaussian.classic_sigma(epsilon=eps, delta=1e-5)
        assert classic >= gaussian.calibrate_analytic(epsilon=eps, delta=1e-5)


@pytest.mark.parametrize("mu", [0.5, 2.711, 7.75])
def test_gdp_mu_round_trip(mu):
    # gdp_mu inverts gdp_delta in μ: 1e-10 relative.
    for eps in (0.0, 1.0, 14.64):
        d = gaussian.gdp_delta(eps, mu=mu)
        if 1e-300 < d < 1:
            assert gaussian.gdp_mu(epsilon=eps, delta=d) == pytest.approx(mu, rel=1e-10)
    d = 1e-5
    eps = gaussian.gdp_epsilon(d, mu=mu)
    assert gaussian.gdp_mu(epsilon=eps, delta=d) == pytest.approx(mu, rel=1e-9)


def test_gaussian_tradeoff_identities():
    # G_μ is symmetric (G_μ(G_μ(α)) = α), G_0 = Id, and G_μ(Φ(−μ/2)) = Φ(−μ/2)
    # (fixed point). Tolerance 1e-12.
    alpha = np.linspace(0, 1, 101)
    for mu in (0.0, 0.5, 2.0):
        g = gaussian.gaussian_tradeoff(alpha, mu=mu)
        assert np.allclose(gaussian.gaussian_tradeoff(g, mu=mu), alpha, atol=1e-12)
        x = stats.norm.cdf(-mu / 2)
        assert gaussian.gaussian_tradeoff(x, mu=mu) == pytest.approx(x, abs=1e-12)
    assert np.allclose(gaussian.gaussian_tradeoff(alpha, mu=0.0), 1 - alpha)
    assert gaussian.gaussian_tradeoff([0.0, 1.0], mu=1.0).tolist() == [1.0, 0.0]


def test_gaussian_tradeoff_against_monte_carlo():
    # Monte Carlo witness: the Neyman-Pearson test of N(0,1) vs N(μ,1) at level α
    # rejects when X > Φ⁻¹(1−α); its type-II error from 400k draws must be within
    # 5 binomial standard errors of G_μ(α).
    rng = np.random.default_rng(7)
    mu, alpha = 1.5, 0.1
    x = rng.normal(mu, 1.0, 400_000)
    beta_hat = float(np.mean(x <= stats.norm.ppf(1 - alpha)))
    beta = float(gaussian.gaussian_tradeoff(alpha, mu=mu))
    se = math.sqrt(beta * (1 - beta) / x.size)
    assert abs(beta_hat - beta) < 5 * se


@pytest.mark.parametrize(
    ("call", "kwargs"),
    [
        (gaussian.delta_for_epsilon, {"epsilon": 1.0, "noise_multiplier": 0.0}),
        (gaussian.delta_for_epsilon, {"epsilon": math.nan, "noise_multiplier": 1.0}),
        (gaussian.delta_for_epsilon, {"epsilon": math.inf, "noise_multiplier": 1.0}),
        (gaussian.epsilon_for_delta, {"delta": 0.0, "noise_multiplier": 1.0}),
        (gaussian.epsilon_for_delta, {"delta": 1.0, "noise_multiplier": 1.0}),
        (gaussian.calibrate_analytic, {"epsilon": -1.0, "delta": 1e-5}),
        (gaussian.classic_sigma, {"epsilon": 1.0, "delta": 1e-5, "sensitivity": 0}),
        (gaussian.gdp_delta, {"epsilon": 1.0, "mu": -0.1}),
        (gaussian.gdp_mu, {"epsilon": -1.0, "delta": 1e-5}),
        (gaussian.gaussian_tradeoff, {"alpha": [0.5, 1.2], "mu": 1.0}),
        (gaussian.mu_from_noise, {"noise_multiplier": True}),
    ],
)
def test_invalid_parameters_raise(call, kwargs):
    with pytest.raises(InvalidParameterError):
        if "epsilon" in kwargs and call in (
            gaussian.delta_for_epsilon,
            gaussian.gdp_delta,
        ):
            eps = kwargs.pop("epsilon")
            call(eps, **kwargs)
        elif "delta" in kwargs and call is gaussian.epsilon_for_delta:
            d = kwargs.pop("delta")
            call(d, **kwargs)
        elif call is gaussian.gaussian_tradeoff:
            call(kwargs.pop("alpha"), **kwargs)
        else:
            call(**kwargs)


def test_numeric_parameters_are_keyword_only():
    with pytest.raises(TypeError):
        gaussian.delta_for_epsilon(1.0, 1.0)  # type: ignore[misc]
    with pytest.raises(TypeError):
        gaussian.calibrate_analytic(1.0, 1e-5)  # type: ignore[misc]
