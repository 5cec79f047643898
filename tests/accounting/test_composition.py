"""Tests for dpfl.accounting.composition (basic, DRV and KOV composition)."""

from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest
from scipy import special

from dpfl.accounting import composition
from dpfl.errors import InvalidParameterError


def _optimal_pure_delta(eps: float, count: int, eps_total: float) -> float:
    """Exact δ(ε_total) of k-fold composition of ε-DP mechanisms.

    Kairouz, Oh & Viswanath (2015), Theorem 3.3 (the worst case is k-fold
    randomized response):
    δ = (1 + e^ε)^{-k} Σ_l C(k,l) [e^{ε(k-l)} - e^{ε_g} e^{ε l}]_+.
    Evaluated in log space.
    """
    ell = np.arange(count + 1)
    log_comb = special.gammaln(count + 1) - special.gammaln(ell + 1)
    log_comb = log_comb - special.gammaln(count - ell + 1)
    a = eps * (count - ell)
    b = eps_total + eps * ell
    positive = a > b
    if not positive.any():
        return 0.0
    # e^a - e^b = e^a (1 - e^{b-a})
    terms = (
        log_comb[positive] + a[positive] + np.log(-np.expm1(b[positive] - a[positive]))
    )
    return float(np.exp(special.logsumexp(terms) - count * np.log1p(math.exp(eps))))


def test_basic_known_values():
    # By hand: 10 x (0.1, 1e-5) -> (1.0, 1e-4); tolerance 1e-12 (float rounding).
    eps, delta = composition.basic(epsilon=0.1, delta=1e-5, count=10)
    assert eps == pytest.approx(1.0, rel=1e-12)
    assert delta == pytest.approx(1e-4, rel=1e-12)
    # δ is capped at 1.
    assert composition.basic(epsilon=1.0, delta=0.3, count=5)[1] == 1.0


def test_heterogeneous_basic_sums_and_validates():
    # By hand: sums of the lists.
    eps, delta = composition.heterogeneous_basic([0.1, 0.2, 0.7], [1e-6, 2e-6, 0.0])
    assert eps == pytest.approx(1.0, rel=1e-12)
    assert delta == pytest.approx(3e-6, rel=1e-12)
    with pytest.raises(InvalidParameterError, match="same length"):
        composition.heterogeneous_basic([0.1], [1e-6, 1e-6])
    with pytest.raises(InvalidParameterError, match=r"epsilons\[1\]"):
        composition.heterogeneous_basic([0.1, -1.0], [0.0, 0.0])


def test_strong_drv_matches_closed_form_in_mpmath():
    # Dwork-Roth Thm 3.20 evaluated independently in 50-digit mpmath; rel 1e-12.
    mpmath.mp.dps = 50
    k, e, d, ds = 100, mpmath.mpf("0.1"), mpmath.mpf("1e-6"), mpmath.mpf("1e-5")
    expected = mpmath.sqrt(2 * k * mpmath.log(1 / ds)) * e + k * e * (mpmath.e**e - 1)
    eps, delta = composition.strong_drv(
        epsilon=0.1, delta=1e-6, count=100, delta_slack=1e-5
    )
    assert eps == pytest.approx(float(expected), rel=1e-12)  # 5.850244...
    assert delta == pytest.approx(float(k * d + ds), rel=1e-12)


def test_spec_0_3_advanced_composition_value():
    # docs/analyses.md: "advanced composition of per-round (0.015, 1e-6) over T = 10,000
    # gives ε ≈ 10.2 at δ = 1e-2".  It is the DRV form with slack δ̃ = 1e-6:
    # ε = 10.1517 (printed to one decimal as 10.2), δ = 1e-2 + 1e-6.
    eps, delta = composition.strong_drv(
        epsilon=0.015, delta=1e-6, count=10_000, delta_slack=1e-6
    )
    assert eps == pytest.approx(10.1517, abs=1e-4)
    assert round(eps, 1) == 10.2
    assert delta == pytest.approx(1.0001e-2, rel=1e-9)
    # Other readings do not give 10.2: slack 1e-2 gives 6.82 (at δ = 2e-2), and
    # KOV at the same total δ ≈ 1e-2 gives a smaller ε.
    eps_b, _ = composition.strong_drv(
        epsilon=0.015, delta=1e-6, count=10_000, delta_slack=1e-2
    )
    assert eps_b == pytest.approx(6.8192, abs=1e-3)
    eps_k, delta_k = composition.strong_kov(
        epsilon=0.015, delta=1e-6, count=10_000, delta_slack=1e-6
    )
    assert eps_k < 9.5 and delta_k <= delta


@pytest.mark.parametrize("eps", [0.01, 0.1, 0.5, 1.0, 2.0])
@pytest.mark.parametrize("count", [1, 10, 100, 10_000])
@pytest.mark.parametrize("slack", [1e-2, 1e-6, 1e-10])
def test_kov_never_worse_than_drv_or_basic(eps, count, slack):
    # KOV Thm 3.5 vs DRV and basic: inequalities, exact (float tolerance 1e-12).
    e_kov, d_kov = composition.strong_kov(
        epsilon=eps, delta=1e-7, count=count, delta_slack=slack
    )
    e_drv, d_drv = composition.strong_drv(
        epsilon=eps, delta=1e-7, count=count, delta_slack=slack
    )
    e_basic, _ = composition.basic(epsilon=eps, delta=1e-7, count=count)
    assert e_kov <= e_drv * (1 + 1e-12)
    assert e_kov <= e_basic * (1 + 1e-12)
    assert d_kov <= d_drv * (1 + 1e-12)


@pytest.mark.parametrize("eps", [0.05, 0.2, 1.0])
@pytest.mark.parametrize("count", [5, 40, 200])
@pytest.mark.parametrize("slack", [1e-3, 1e-6])
def test_kov_and_drv_are_valid_against_optimal_composition(eps, count, slack):
    # Witness: the exact optimal composition of pure ε-DP (KOV Thm 3.3) must
    # need no more than δ̃ at the ε each bound claims (relative slack 1e-9).
    for fn in (composition.strong_kov, composition.strong_drv):
        eps_total, _ = fn(epsilon=eps, delta=0.0, count=count, delta_slack=slack)
        assert _optimal_pure_delta(eps, count, eps_total) <= slack * (1 + 1e-9)


def test_kov_delta_closed_form():
    # δ_tot = 1 - (1-δ)^k (1-δ̃), computed directly; rel 1e-12.
    _, delta = composition.strong_kov(
        epsilon=0.1, delta=1e-4, count=50, delta_slack=1e-5
    )
    assert delta == pytest.approx(1 - (1 - 1e-4) ** 50 * (1 - 1e-5), rel=1e-12)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"epsilon": -0.1, "delta": 1e-5, "count": 3, "delta_slack": 1e-5},
        {"epsilon": 0.1, "delta": 1.5, "count": 3, "delta_slack": 1e-5},
        {"epsilon": 0.1, "delta": 1e-5, "count": 0, "delta_slack": 1e-5},
        {"epsilon": 0.1, "delta": 1e-5, "count": 3, "delta_slack": 0.0},
        {"epsilon": 0.1, "delta": 1e-5, "count": 2.5, "delta_slack": 1e-5},
    ],
)
def test_invalid_parameters_raise(kwargs):
    with pytest.raises(InvalidParameterError):
        composition.strong_drv(**kwargs)
    with pytest.raises(InvalidParameterError):
        composition.strong_kov(**kwargs)
