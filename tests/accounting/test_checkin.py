"""Tests for dpfl.accounting.checkin and .checkin_global (MS-PAFL, docs/analyses.md)."""

from __future__ import annotations

import math

import mpmath
import pytest
from scipy import stats

from dpfl.accounting import checkin, checkin_global, composition, reports
from dpfl.errors import InvalidParameterError

# docs/analyses.md example, reverse-engineered (notes/checkin.md): local
# ε = 0.5, δ = 1e-5 (Lemma 1 with Δ = 2C), γ = 0.1, p R = 20 rounds.
EX_Z = 2 * math.sqrt(2 * math.log(1.25 / 1e-5)) / 0.5  # σ / C = 19.379


def _gdp_delta_mp(eps: float, mu: float) -> float:
    """μ-GDP δ(ε) in 40-digit mpmath (DRS Cor. 2.13), an independent witness."""
    mpmath.mp.dps = 40
    e, m = mpmath.mpf(eps), mpmath.mpf(mu)
    return float(
        mpmath.ncdf(-e / m + m / 2) - mpmath.e**e * mpmath.ncdf(-e / m - m / 2)
    )


# --- Lemma 1 and Theorem 1 -------------------------------------------------
def test_lemma1_sigma_closed_form_and_range():
    # By hand: sqrt(2 ln(1.25e5)) * 2 / 0.5 = 4 * 4.84481 = 19.3792; rel 1e-12.
    sigma = checkin.lemma1_sigma(epsilon=0.5, delta=1e-5, sensitivity=2.0)
    assert sigma == pytest.approx(EX_Z, rel=1e-12)
    assert sigma == pytest.approx(19.3792, abs=1e-4)
    with pytest.raises(InvalidParameterError, match="epsilon must be < 1"):
        checkin.lemma1_sigma(epsilon=1.0, delta=1e-5, sensitivity=2.0)
    # The paper's number is still available on request.
    loose = checkin.lemma1_sigma(
        epsilon=2.0, delta=1e-5, sensitivity=2.0, allow_invalid=True
    )
    assert loose == pytest.approx(EX_Z / 4, rel=1e-12)


def test_subsampling_ratio_values():
    # Closed forms of docs/analyses.md / §1.3 item 8, by hand; rel 1e-12.
    assert checkin.subsampling_ratio(
        batch_size=32, dataset_size=320, replacement=False
    ) == pytest.approx(0.1, rel=1e-12)
    assert checkin.subsampling_ratio(
        batch_size=32, dataset_size=320, replacement=True
    ) == pytest.approx(1 - (1 - 1 / 320) ** 32, rel=1e-12)
    assert checkin.subsampling_ratio(
        batch_size=32, dataset_size=320, replacement=False, local_steps=3
    ) == pytest.approx(1 - 0.9**3, rel=1e-12)
    assert checkin.subsampling_ratio(
        batch_size=32, dataset_size=320, replacement=True, local_steps=3
    ) == pytest.approx(1 - (1 - 1 / 320) ** 96, rel=1e-12)
    assert (
        checkin.subsampling_ratio(batch_size=5, dataset_size=5, replacement=False) == 1
    )
    with pytest.raises(InvalidParameterError, match="batch_size"):
        checkin.subsampling_ratio(batch_size=6, dataset_size=5, replacement=False)


@pytest.mark.parametrize("n", [10, 100, 32561])
@pytest.mark.parametrize("b", [2, 8, 10])
def test_with_replacement_ratio_is_smaller(n, b):
    # Remark 2: γ_WR < γ_WOR for b >= 2 (strict inequality).
    wr = checkin.subsampling_ratio(batch_size=b, dataset_size=n, replacement=True)
    wor = checkin.subsampling_ratio(batch_size=b, dataset_size=n, replacement=False)
    assert wr < wor


def test_amplified_closed_form():
    # ln(1 + 0.1 (e^0.5 - 1)) = ln(1.0648721) = 0.0628547; rel 1e-12; δ' = γ δ.
    eps, delta = checkin.amplified(epsilon=0.5, delta=1e-5, gamma=0.1)
    assert eps == pytest.approx(math.log(1 + 0.1 * (math.exp(0.5) - 1)), rel=1e-12)
    assert eps == pytest.approx(0.0628547, abs=1e-7)
    assert delta == pytest.approx(1e-6, rel=1e-12)
    assert checkin.amplified(epsilon=0.5, delta=1e-5, gamma=1.0) == pytest.approx(
        (0.5, 1e-5), rel=1e-12
    )


# --- Theorem 2 / Corollary 1 -------------------------------------------------
def test_spec_1_3_item_4_tail_values():
    # docs/analyses.md (K = 1000, p = 0.1, ξ = 0.5): Hoeffding 1.3e-2, exact 2.8e-9.
    hoeff = checkin_global.hoeffding_tail(clients=1000, probability=0.1, xi=0.5)
    assert hoeff == pytest.approx(2 * math.exp(-5), rel=1e-12)  # 1.3476e-2
    assert f"{hoeff:.1e}" == "1.3e-02"
    exact = checkin_global.binomial_tail(clients=1000, probability=0.1, xi=0.5)
    # Witness: 40-digit mpmath sum of the Binomial(1000, 0.1) pmf for N <= 49.
    mpmath.mp.dps = 40
    witness = mpmath.fsum(
        mpmath.binomial(1000, j)
        * mpmath.mpf("0.1") ** j
        * mpmath.mpf("0.9") ** (1000 - j)
        for j in range(50)
    )
    assert exact == pytest.approx(float(witness), rel=1e-9)
    assert f"{exact:.1e}" == "2.8e-09"


@pytest.mark.parametrize("clients", [10, 100, 1000, 10_000])
@pytest.mark.parametrize("probability", [0.01, 0.1, 0.5, 0.9])
@pytest.mark.parametrize("xi", [0.1, 0.3, 0.5, 0.9])
def test_exact_tail_never_exceeds_hoeffding(clients, probability, xi):
    # Hoeffding's one-sided bound holds for the exact tail (an inequality).
    exact = checkin_global.binomial_tail(
        clients=clients, probability=probability, xi=xi
    )
    one_sided = checkin_global.hoeffding_tail(
        clients=clients, probability=probability, xi=xi, one_sided=True
    )
    assert exact <= one_sided * (1 + 1e-12)


def test_binomial_tail_threshold_is_robust_to_round_off():
    # (1 - 0.7) * 100 * 0.1 = 3.0000000000000004 in floats; the event is N < 3.
    value = checkin_global.binomial_tail(clients=100, probability=0.1, xi=0.7)
    assert value == pytest.approx(stats.binom.cdf(2, 100, 0.1), rel=1e-12)


def test_central_round_hand_checked():
    # Corollary 1 (20a-b) evaluated independently in mpmath; rel 1e-12.
    # ε = 0.5, δ = 1e-5, K = 1000, p = 0.1, γ = 0.1, ξ = 0.5, exact tail.
    mpmath.mp.dps = 40
    delta_h = checkin_global.binomial_tail(clients=1000, probability=0.1, xi=0.5)
    eps_agg = mpmath.mpf("0.5") / mpmath.sqrt(50)  # 0.0707107
    p_gamma = mpmath.mpf("0.01")
    expected_eps = mpmath.log(1 + p_gamma * (mpmath.e**eps_agg - 1)) + mpmath.log(
        1 / (1 - mpmath.mpf(delta_h))
    )
    eps_c, delta_c = checkin_global.central_round(
        epsilon=0.5, delta=1e-5, clients=1000, probability=0.1, gamma=0.1, xi=0.5
    )
    assert eps_c == pytest.approx(float(expected_eps), rel=1e-12)  # 7.3244e-4
    assert eps_c == pytest.approx(7.3244e-4, rel=1e-4)
    assert delta_c == pytest.approx(1e-7 + delta_h, rel=1e-12)
    # Paper's Hoeffding tail: δ_c ≈ 1.35e-2, so 100 rounds give R δ_c > 1
    # (docs/analyses.md).
    eps_h, delta_hoeff = checkin_global.central_round(
        epsilon=0.5,
        delta=1e-5,
        clients=1000,
        probability=0.1,
        gamma=0.1,
        xi=0.5,
        tail="hoeffding",
    )
    assert delta_hoeff == pytest.approx(1e-7 + 2 * math.exp(-5), rel=1e-12)
    assert 100 * delta_hoeff > 1
    assert eps_h > eps_c  # ln(1/(1 - δ_H)) = 0.01357 dominates


def test_central_round_first_order_approximation():
    # Eq. (21): ε_c ≈ γ ε sqrt(p/((1-ξ)K)) for small ε_agg; here ε_agg = 0.0224,
    # so the approximation is within 1.2% (e^x - 1 ≈ x (1 + x/2)).
    eps_c, _ = checkin_global.central_round(
        epsilon=0.5, delta=1e-5, clients=10_000, probability=0.1, gamma=0.1, xi=0.5
    )
    approx = 0.1 * 0.5 * math.sqrt(0.1 / (0.5 * 10_000))
    assert eps_c == pytest.approx(approx, rel=0.012)


def test_central_round_monotone():
    base = dict(
        epsilon=0.5, delta=1e-5, clients=1000, probability=0.1, gamma=0.1, xi=0.5
    )
    eps0, _ = checkin_global.central_round(**base)
    for key, larger in (("probability", 0.2), ("gamma", 0.2), ("epsilon", 0.8)):
        assert checkin_global.central_round(**{**base, key: larger})[0] > eps0
    assert checkin_global.central_round(**{**base, "clients": 4000})[0] < eps0


def test_central_round_rejects_invalid_classic_regime():
    with pytest.raises(InvalidParameterError, match="must be < 1"):
        checkin_global.central_round(
            epsilon=0.9, delta=1e-5, clients=2, probability=0.5, gamma=0.1, xi=0.5
        )
    with pytest.raises(InvalidParameterError, match="tail"):
        checkin_global.central_round(
            epsilon=0.5,
            delta=1e-5,
            clients=1000,
            probability=0.1,
            gamma=0.1,
            xi=0.5,
            tail="chernoff",
        )


# --- Theorem 3, sound client, exact PLD -------------------------------------
def test_local_total_moments_spec_example():
    # docs/analyses.md "formula 0.333": A = 20 γ² (2C)²/((1-γ) σ²), C = 1.
    out = checkin.local_total_moments(
        probability=1.0,
        rounds=20,
        gamma=0.1,
        noise_multiplier=EX_Z,
        clip=1.0,
        delta=1e-5,
    )
    a = 20 * 0.01 * 4 / (0.9 * EX_Z**2)
    assert out["A"] == pytest.approx(a, rel=1e-12)
    assert out["epsilon"] == pytest.approx(
        a + 2 * math.sqrt(a * math.log(1e5)), rel=1e-12
    )
    assert out["epsilon"] == pytest.approx(0.3325, abs=5e-5)
    # reference: "gamma >= 1/(16 sigma/2C) in our example" -> invalid.
    assert out["sigma_over_sensitivity_ge_1"] is True
    assert out["gamma_lt_1_over_16z"] is False
    assert out["valid"] is False


def test_local_total_moments_scales_as_gamma_sqrt_pR():
    # ε ≈ 2 sqrt(A ln 1/δ) ∝ γ sqrt(pR) when A is small: quadrupling p R doubles
    # the λ²-only term exactly.
    kw = dict(gamma=0.01, noise_multiplier=40.0, clip=1.0, delta=1e-5)
    one = checkin.local_total_moments(probability=0.1, rounds=100, **kw)
    four = checkin.local_total_moments(probability=0.4, rounds=100, **kw)
    assert four["epsilon_quadratic_only"] == pytest.approx(
        2 * one["epsilon_quadratic_only"], rel=1e-12
    )


def test_pld_subsampled_local_reproduces_spec_example():
    # docs/analyses.md: "ε 0.154 vs formula 0.333 at pR = 20 rounds"; we get
    # 0.15434 (printed to 3 decimals: abs tolerance 5e-4).
    eps = checkin.pld_subsampled_local(
        gamma=0.1, noise_multiplier=EX_Z, clip=1.0, rounds_joined=20, delta=1e-5
    )
    assert eps == pytest.approx(0.154, abs=5e-4)
    # Discretisation refined tenfold changes it by < 1e-5.
    fine = checkin.pld_subsampled_local(
        gamma=0.1,
        noise_multiplier=EX_Z,
        clip=1.0,
        rounds_joined=20,
        delta=1e-5,
        value_discretization_interval=1e-5,
    )
    assert fine <= eps + 1e-9
    assert eps - fine < 1e-5
    # Symmetrised C_γ(G) is at least the add/remove Poisson answer (0.15238 with
    # dp_accounting from_gaussian_mechanism composed per direction, docs/analyses.md).
    from dp_accounting.pld import privacy_loss_distribution as pld

    poisson = pld.from_gaussian_mechanism(EX_Z / 2, sampling_prob=0.1).self_compose(20)
    assert eps >= poisson.get_epsilon_for_delta(1e-5)


@pytest.mark.parametrize("z, rounds", [(2.0, 20), (5.0, 3), (1.0, 1)])
def test_pld_without_subsampling_is_gaussian(z, rounds):
    # γ = 1: C_1(G_μ)^{⊗N} = G_{μ sqrt N} exactly; the pessimistic PLD's ε must
    # satisfy the closed-form δ at ε (mpmath) within 1e-3 relative, from above.
    eps = checkin.pld_subsampled_local(
        gamma=1.0, noise_multiplier=z, clip=1.0, rounds_joined=rounds, delta=1e-5
    )
    mu = 2 / z * math.sqrt(rounds)
    assert _gdp_delta_mp(eps, mu) <= 1e-5 * (1 + 1e-6)
    assert _gdp_delta_mp(eps * 0.999, mu) > 1e-5


def test_sound_client_gdp():
    out = checkin.sound_client(
        noise_multiplier=EX_Z, clip=3.0, rounds_joined=20, delta=1e-5
    )
    mu = 2 / EX_Z * math.sqrt(20)  # 0.46154, clip cancels
    assert out["mu"] == pytest.approx(mu, rel=1e-12)
    assert out["noise_std"] == pytest.approx(3 * EX_Z, rel=1e-12)
    # Witness: mpmath δ(ε; μ) at the returned ε equals the target to 1e-8.
    assert _gdp_delta_mp(out["epsilon"], mu) == pytest.approx(1e-5, rel=1e-8)
    assert out["epsilon"] == pytest.approx(1.8229, abs=1e-4)
    # Without amplification it is far above the amplified (unsound here) PLD.
    assert out["epsilon"] > 10 * 0.154
    assert out["adversary"].startswith("the parameter server")
    assert (
        checkin.sound_client(
            noise_multiplier=1.0, clip=1.0, rounds_joined=0, delta=1e-5
        )["epsilon"]
        == 0.0
    )


def test_global_total_methods():
    eps_c, delta_c = checkin_global.central_round(
        epsilon=0.5, delta=1e-5, clients=1000, probability=0.1, gamma=0.1, xi=0.5
    )
    drv = checkin_global.global_total(
        eps_max=eps_c, delta_max=delta_c, rounds=500, delta_slack=1e-6
    )
    assert drv == composition.strong_drv(
        epsilon=eps_c, delta=delta_c, count=500, delta_slack=1e-6
    )
    kov = checkin_global.global_total(
        eps_max=eps_c, delta_max=delta_c, rounds=500, delta_slack=1e-6, method="kov"
    )
    assert kov[0] <= drv[0] and kov[1] <= drv[1]
    with pytest.raises(InvalidParameterError, match="method"):
        checkin_global.global_total(
            eps_max=0.1, delta_max=1e-6, rounds=5, delta_slack=1e-6, method="rdp"
        )


# ------------------------------------------- Theorem 2, heterogeneous p_k (eq. 19)
def test_poisson_binomial_tail_equals_enumeration():
    # Independent reference: enumerate all 2^10 check-in patterns of 10
    # clients with distinct p_j and add the probabilities of those with
    # N < (1-ξ)Σp_j. Agreement to 1e-12 absolute.
    import itertools

    import numpy as np

    p = np.array([0.05, 0.1, 0.2, 0.2, 0.35, 0.5, 0.6, 0.75, 0.9, 1.0])
    for xi in (0.1, 0.3, 0.5, 0.8):
        threshold = (1 - xi) * p.sum()
        ref = 0.0
        for pattern in itertools.product((0, 1), repeat=p.size):
            z = np.array(pattern)
            if z.sum() < threshold:
                ref += float(np.prod(np.where(z == 1, p, 1 - p)))
        got = checkin_global.poisson_binomial_tail(probabilities=p, xi=xi)
        assert got == pytest.approx(ref, abs=1e-12)
    # Equal p_j: the binomial tail (K = 1000, p = 0.1, ξ = 0.5: 2.787e-9).
    uniform = checkin_global.poisson_binomial_tail(
        probabilities=np.full(1000, 0.1), xi=0.5
    )
    assert uniform == pytest.approx(
        checkin_global.binomial_tail(clients=1000, probability=0.1, xi=0.5), rel=1e-9
    )


def test_central_round_clients_reduces_to_uniform_and_orders_clients():
    import numpy as np

    # Uniform p, γ: eq. 19 is eq. 20 for every client and every tail (1e-12).
    for tail in ("binomial", "hoeffding", "hoeffding-one-sided"):
        kw = dict(epsilon=0.5, delta=1e-5, xi=0.5, tail=tail)
        eps, dlt = checkin_global.central_round_clients(
            probabilities=np.full(1000, 0.1), gammas=0.2, **kw
        )
        ref = checkin_global.central_round(
            clients=1000, probability=0.1, gamma=0.2, **kw
        )
        assert np.allclose(eps, ref[0], rtol=1e-12, atol=0)
        assert np.allclose(dlt, ref[1], rtol=1e-12, atol=0)
    # Heterogeneous: half the clients at p = 0.05, half at 0.2. The client with
    # the larger p_k is more exposed, and reading the run as if every client
    # had max p_k (K p = 200 expected check-ins instead of Σ p_j = 125)
    # understates ε_agg and so the figure.
    p = np.r_[np.full(500, 0.05), np.full(500, 0.2)]
    eps, dlt = checkin_global.central_round_clients(
        epsilon=0.5, delta=1e-5, probabilities=p, gammas=0.2, xi=0.5
    )
    assert eps[-1] > eps[0] and dlt[-1] > dlt[0]
    as_if_max, _ = checkin_global.central_round(
        epsilon=0.5, delta=1e-5, clients=1000, probability=0.2, gamma=0.2, xi=0.5
    )
    assert eps[-1] > as_if_max
    with pytest.raises(InvalidParameterError, match=r"probabilities must all lie"):
        checkin_global.central_round_clients(
            epsilon=0.5, delta=1e-5, probabilities=[0.1, 0.0], gammas=0.2, xi=0.5
        )


def test_ms_pafl_report_sound_entry_is_sound_under_a_paper_run():
    # A run charged under analysis="paper" (check-in amplified as Poisson(p),
    # not valid against the server) must still label as "sound" the sound
    # figure: the client's un-amplified Gaussian composed over the rounds it
    # joined. Independent value: the exact Gaussian-DP composition, mu =
    # sqrt(N_k) * 2 / sigma (replace-one, sensitivity 2C), converted by the
    # closed form of Dong, Roth & Su (2022, Cor. 2.13), computed here; 2%
    # (the ledger's PLD bracket tolerance).
    from scipy import optimize, special

    from dpfl.accounting import events
    from dpfl.accounting.ledger import PrivacyLedger

    sigma, rounds, delta = 2.0, 12, 1e-5
    ledger = PrivacyLedger(analysis="paper")
    event = events.CheckIn(0.3, events.Gaussian(sigma))
    for r in range(rounds):
        ledger.record(event, participants=[0] if r % 2 == 0 else [1, 0])
    report = reports.ms_pafl_report(
        ledger,
        noise_multiplier=sigma,
        clip=1.0,
        probabilities=[0.3, 0.3],
        local_epsilon=0.5,
        local_delta=1e-6,
        gamma=1.0,
        xi=0.5,
        delta=delta,
    )
    mu = math.sqrt(rounds) * 2.0 / sigma  # client 0 joined every round

    def gdp_delta(eps):
        return special.ndtr(-eps / mu + mu / 2) - math.exp(eps) * special.ndtr(
            -eps / mu - mu / 2
        )

    exact = optimize.brentq(lambda e: gdp_delta(e) - delta, 0.0, 100.0)
    assert report["sound"]["epsilon"] == pytest.approx(exact, rel=0.02)
    assert report["sound"]["epsilon"] >= exact * (1 - 1e-9)
    assert report["paper_ledger"]["epsilon"] < report["sound"]["epsilon"]
