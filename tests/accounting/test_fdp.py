"""Tests of dpfl.accounting.fdp (trade-off functions, PriFedSync accounting)."""

import functools
import math
import time
import warnings

import numpy as np
import pytest
from dp_accounting.pld import privacy_loss_distribution, privacy_loss_mechanism
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from dpfl.accounting import fdp, federated, gaussian, subsampled
from dpfl.accounting.bounds import Bound, Guarantee
from dpfl.errors import InvalidParameterError

# docs/analyses.md table (federated-f-dp.txt Tables 1-2, MNIST, n = 600):
# (p, sigma, B, K, R, paper mu_max, eps(G_mu), eps_exact, mu_eff)
MNIST_ROWS = [
    (1.0, 1.0, 16, 38, 93, 2.71, 14.64, 13.88, 2.60),
    (1.0, 0.9, 16, 38, 83, 3.10, 17.39, 16.16, 2.93),
    (1.0, 0.75, 16, 38, 64, 3.96, 24.07, 21.02, 3.58),
    (0.5, 1.0, 16, 38, 194, 3.92, 23.69, 22.28, 3.74),
    (0.5, 0.9, 16, 38, 176, 4.51, 28.72, 26.35, 4.24),
    (0.5, 0.75, 16, 38, 127, 5.58, 38.64, 32.90, 4.98),
    (0.25, 1.0, 16, 38, 386, 5.52, 38.07, 35.57, 5.26),
    (0.25, 0.9, 16, 38, 325, 6.13, 44.19, 40.19, 5.74),
    (0.25, 0.75, 16, 38, 245, 7.75, 62.32, 52.03, 6.86),
    (0.5, 1.0, 8, 76, 266, 3.24, 18.45, 17.84, 3.16),
    (0.5, 0.9, 8, 76, 229, 3.64, 21.49, 20.48, 3.51),
    (0.5, 0.75, 8, 76, 191, 4.84, 31.64, 28.65, 4.50),
]
# federated-f-dp.txt Table 3 (CIFAR-10, n = 500, B = 16, K = 32): (sigma, R, mu)
CIFAR_ROWS = [
    (1.0, 468, 6.70),
    (0.75, 321, 9.77),
    (0.5, 207, 26.81),
    (1.0, 904, 9.31),
    (0.75, 671, 14.13),
    (0.5, 405, 37.51),
]
DELTA = 1e-5  # the δ of the reference table's eps columns (see test_table_delta_is_1e5)


def _mnist_mu(row):
    _, sigma, b, k, r, *_ = row
    return fdp.clt_mu(
        noise_multiplier=sigma,
        batch_size=b,
        records_per_client=600,
        local_steps=k,
        rounds=r,
    )


@pytest.mark.parametrize("row", MNIST_ROWS)
def test_clt_mu_reproduces_tables_1_2(row):
    # Source: federated-f-dp.txt Tables 1-2 (column mu_max), = docs/analyses.md "paper".
    # Tolerance: the printed 2 decimals (|mu - printed| <= 0.005).
    assert abs(_mnist_mu(row) - row[5]) <= 0.005


@pytest.mark.parametrize(("sigma", "rounds", "printed"), CIFAR_ROWS)
def test_clt_mu_reproduces_table_3(sigma, rounds, printed):
    # Source: federated-f-dp.txt Table 3 (CIFAR-10). Tolerance: printed 2 decimals.
    mu = fdp.clt_mu(
        noise_multiplier=sigma,
        batch_size=16,
        records_per_client=500,
        local_steps=32,
        rounds=rounds,
    )
    assert abs(mu - printed) <= 0.005


def test_clt_mu_uses_sqrt2_c_not_sqrt_2c():
    # docs/analyses.md: the main text's sqrt(2c) would give 2.15 for row 1, the
    # table prints 2.71 = sqrt(2)·c·sqrt(H). Closed form, tolerance 1e-12.
    c = (16 / 600) * math.sqrt(38 * 93)
    h = math.exp(1.0) * stats.norm.cdf(1.5) + 3 * stats.norm.cdf(-0.5) - 2
    assert _mnist_mu(MNIST_ROWS[0]) == pytest.approx(
        math.sqrt(2) * c * math.sqrt(h), rel=1e-12
    )
    assert abs(math.sqrt(2 * c) * math.sqrt(h) - 2.15) < 0.01


@pytest.mark.parametrize("row", MNIST_ROWS[:3])
def test_table_delta_is_1e5(row):
    # Which δ did docs/analyses.md use for eps(G_mu)? At δ = 1e-5 the CLT μ gives the
    # printed column (2 decimals, ±0.005); at δ = 1e-6 it would be >= 1.3 larger.
    mu = _mnist_mu(row)
    assert abs(gaussian.gdp_epsilon(1e-5, mu=mu) - row[6]) <= 0.005
    assert gaussian.gdp_epsilon(1e-6, mu=mu) - row[6] > 1.0


@pytest.mark.parametrize("index", [0, 3, 5, 9])
def test_exact_epsilon_and_mu_eff_match_spec_table(index):
    # Source: docs/analyses.md columns eps_exact and mu_eff (δ = 1e-5).
    # Tolerance: 0.02 absolute on ε, 0.005 on mu_eff (printed 2 decimals);
    # the bracket [lower, upper] must be narrower than 0.01 at h = 1e-3 and
    # contain the printed value within the 0.005 rounding.
    _, sigma, b, k, r, _, _, eps_exact, mu_eff = MNIST_ROWS[index]
    bound = subsampled.exact_epsilon(
        DELTA,
        noise_multiplier=sigma,
        batch_size=b,
        records_per_client=600,
        local_steps=k,
        rounds=r,
    )
    assert isinstance(bound, Bound)
    assert abs(bound.upper - eps_exact) <= 0.02
    assert bound.upper - bound.lower < 0.01
    assert bound.lower - 0.005 <= eps_exact <= bound.upper + 0.005
    assert (
        abs(subsampled.mu_effective(epsilon=bound.upper, delta=DELTA) - mu_eff) <= 0.005
    )


@pytest.mark.parametrize(
    ("sigma", "rounds", "mu_eff"),
    [(1.0, 468, 6.33), (0.5, 207, 14.64), (0.5, 405, 20.21)],
)
def test_cifar_exact_mu_eff_matches_spec(sigma, rounds, mu_eff):
    # Source: docs/analyses.md (Table 3 CIFAR, exact mu_eff at δ = 1e-5; the CLT μ is
    # 26.81 / 37.51 at σ = 0.5, far above). Tolerance: printed 2 decimals.
    bound = subsampled.exact_epsilon(
        DELTA,
        noise_multiplier=sigma,
        batch_size=16,
        records_per_client=500,
        local_steps=32,
        rounds=rounds,
    )
    assert (
        abs(subsampled.mu_effective(epsilon=bound.upper, delta=DELTA) - mu_eff) <= 0.005
    )


def test_exact_composition_is_fast():
    # docs/analyses.md: each exact composition takes < 1 s (measured ~0.1 s for upper
    # and lower together on 2 cores); asserted with slack for slow CI machines.
    subsampled._composed.cache_clear()
    start = time.perf_counter()
    subsampled.exact_epsilon(
        DELTA,
        noise_multiplier=0.75,
        batch_size=16,
        records_per_client=600,
        local_steps=38,
        rounds=245,
    )
    assert time.perf_counter() - start < 3.0


def test_exact_delta_brackets_and_agrees_with_exact_epsilon():
    # Consistency: δ(ε_upper) <= 1e-5 (the pessimistic PLD certifies it), and the
    # bracket of δ(ε) contains δ = 1e-5 at ε inside the ε bracket. Row 1.
    kwargs = dict(
        noise_multiplier=1.0,
        batch_size=16,
        records_per_client=600,
        local_steps=38,
        rounds=93,
    )
    eb = subsampled.exact_epsilon(DELTA, **kwargs)
    db = subsampled.exact_delta(eb.upper, **kwargs)
    assert db.upper <= DELTA * (1 + 1e-9)
    assert db.lower <= db.upper
    db_low = subsampled.exact_delta(eb.lower, **kwargs)
    assert db_low.lower <= DELTA * (1 + 1e-9) <= db_low.upper * (1 + 1e-6)


@pytest.mark.parametrize(("sigma", "steps"), [(5.0, (10, 10)), (2.0, (4, 25))])
def test_full_batch_is_gaussian_composition(sigma, steps):
    # p = B/n = 1: C_1(G_{1/σ})^{⊗T} = G_{sqrt(T)/σ} exactly (DRS Cor 3.3).
    # Tolerance 1e-6 on δ (docs/analyses.md check) at h = 1e-4 (measured <= 4.1e-8; at
    # the default h = 1e-3 the error is <= 4.1e-6, second order in h), and the
    # bracket must contain the truth.
    k, r = steps
    mu = math.sqrt(k * r) / sigma
    kwargs = dict(
        noise_multiplier=sigma,
        batch_size=20,
        records_per_client=20,
        local_steps=k,
        rounds=r,
        value_discretization=1e-4,
    )
    for eps in (0.0, 0.5, 2.0, 5.0):
        truth = gaussian.gdp_delta(eps, mu=mu)
        b = subsampled.exact_delta(eps, **kwargs)
        assert abs(b.upper - truth) <= 1e-6
        assert abs(b.lower - truth) <= 1e-6
        assert b.lower - 1e-12 <= truth <= b.upper + 1e-12
    eb = subsampled.exact_epsilon(1e-5, **kwargs)
    assert eb.lower - 1e-9 <= gaussian.gdp_epsilon(1e-5, mu=mu) <= eb.upper + 1e-9


@pytest.mark.parametrize(("sigma", "p"), [(1.0, 16 / 600), (0.75, 8 / 600), (0.5, 0.3)])
def test_one_step_tradeoff_from_pld_equals_closed_form_hull(sigma, p):
    # The trade-off read back from the one-step PLD (pessimistic and optimistic)
    # equals the closed-form C_p(G_{1/σ}) (three pieces, incl. the slope −1
    # segment) to 1e-4 (docs/analyses.md check), and brackets it:
    # f_pess <= f <= f_opt (to 1e-12).
    mu = 1 / sigma
    x_star = stats.norm.cdf(-mu / 2)
    f_x_star = p * x_star + (1 - p) * stats.norm.cdf(mu / 2)
    alpha = np.unique(
        np.concatenate([np.linspace(0, 1, 201), np.linspace(x_star, f_x_star, 21)])
    )
    closed = fdp.subsampled_tradeoff(alpha, mu=mu, sampling_probability=p)
    pess = subsampled.subsampled_gaussian_pld(
        noise_multiplier=sigma, sampling_probability=p
    )
    opt = subsampled.subsampled_gaussian_pld(
        noise_multiplier=sigma, sampling_probability=p, pessimistic=False
    )
    f_pess = fdp.tradeoff_from_deltas(alpha, pess)
    f_opt = fdp.tradeoff_from_deltas(alpha, opt)
    assert np.max(np.abs(f_pess - closed)) <= 1e-4
    assert np.max(np.abs(f_opt - closed)) <= 1e-4
    assert np.all(f_pess <= closed + 1e-12)
    assert np.all(f_opt >= closed - 1e-12)
    # the linear piece really has slope −1
    seg = (alpha >= x_star) & (alpha <= f_x_star)
    assert np.allclose(closed[seg] + alpha[seg], x_star + f_x_star, atol=1e-12)


def _definitional_hull(mu, p, n=200_001):
    """min(f_p, f_p^{-1})** from its definition, on a fine grid (independent)."""
    t = np.linspace(0, 1, n)
    fp = p * stats.norm.cdf(stats.norm.isf(t) - mu) + (1 - p) * (1 - t)
    # f_p^{-1}: reflect the graph of f_p (decreasing) about the diagonal
    order = np.argsort(fp)
    finv = np.interp(t, fp[order], t[order])
    y = np.minimum(fp, finv)
    hull = [0]
    for i in range(1, n):  # lower convex hull, monotone chain
        while len(hull) >= 2:
            i0, i1 = hull[-2], hull[-1]
            cross = (t[i1] - t[i0]) * (y[i] - y[i0]) - (y[i1] - y[i0]) * (t[i] - t[i0])
            if cross <= 0:
                hull.pop()
            else:
                break
        hull.append(i)
    return lambda a: np.interp(a, t[hull], y[hull])


@pytest.mark.parametrize(("mu", "p"), [(1.0, 0.2), (2.0, 0.5), (0.5, 0.9)])
def test_closed_form_equals_definitional_hull(mu, p):
    # Source: the definition C_p(f) = min{f_p, f_p^{-1}}** evaluated on a 2e5-point
    # grid with a monotone-chain convex hull. Tolerance 2e-6 (grid resolution).
    alpha = np.linspace(0, 1, 501)
    hull = _definitional_hull(mu, p)
    closed = fdp.subsampled_tradeoff(alpha, mu=mu, sampling_probability=p)
    assert np.max(np.abs(closed - hull(alpha))) <= 2e-6


@pytest.mark.parametrize(("mu", "p"), [(1.0, 0.2), (2.0, 0.05)])
def test_symmetrised_profile_is_conjugate_of_closed_form(mu, p):
    # docs/analyses.md: δ_C = max(δ_add, δ_rem) is the profile of C_p(G_μ). Check both
    # conversions of §3.4: δ from the closed-form f (1e-8) and f from the δ
    # profile (1e-6, ε grid step 1e-3).
    f = functools.partial(fdp.subsampled_tradeoff, mu=mu, sampling_probability=p)
    for eps in (-1.0, -0.1, 0.0, 0.3, 1.0, 3.0):
        closed = float(
            subsampled.subsampled_gaussian_delta(eps, mu=mu, sampling_probability=p)
        )
        assert fdp.delta_from_tradeoff(eps, f) == pytest.approx(closed, abs=1e-8)
    alpha = np.linspace(0, 1, 101)

    def profile(e):
        return subsampled.subsampled_gaussian_delta(e, mu=mu, sampling_probability=p)

    assert np.max(np.abs(fdp.tradeoff_from_deltas(alpha, profile) - f(alpha))) <= 1e-6


def _random_subsampled_cases(n=20, seed=11):
    rng = np.random.default_rng(seed)
    return [
        (rng.uniform(0.3, 4.0), rng.uniform(0.001, 1.0), rng.uniform(-3.0, 8.0))
        for _ in range(n)
    ]


@pytest.mark.parametrize(("sigma", "p", "eps"), _random_subsampled_cases())
def test_add_remove_closed_forms_match_dp_accounting(sigma, p, eps):
    # Source: dp_accounting GaussianPrivacyLoss(σ, sampling_prob=p,
    # adjacency_type=ADD/REMOVE).get_delta_for_epsilon. Tolerance: 1e-9 relative
    # or 1e-15 absolute.
    for direction, adjacency in (
        ("add", privacy_loss_mechanism.AdjacencyType.ADD),
        ("remove", privacy_loss_mechanism.AdjacencyType.REMOVE),
    ):
        ref = privacy_loss_mechanism.GaussianPrivacyLoss(
            sigma, sampling_prob=p, adjacency_type=adjacency
        ).get_delta_for_epsilon(eps)
        ours = float(
            subsampled.subsampled_gaussian_delta(
                eps, mu=1 / sigma, sampling_probability=p, direction=direction
            )
        )
        assert ours == pytest.approx(ref, rel=1e-9, abs=1e-15)


def test_symmetrise_then_compose_pitfall():
    # docs/analyses.md pitfall, Table-1 row 1: composing add and remove separately
    # (dp_accounting from_gaussian_mechanism(σ, sampling_prob=p).self_compose)
    # gives the Poisson add/remove answer 10.82; the symmetrised C_p^{⊗KR} gives
    # 13.88, and is always >= it. Tolerance 0.02 (the reference table's printed digits).
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        poisson = (
            privacy_loss_distribution.from_gaussian_mechanism(
                1.0, sampling_prob=16 / 600, value_discretization_interval=1e-3
            )
            .self_compose(38 * 93)
            .get_epsilon_for_delta(DELTA)
        )
    exact = subsampled.exact_epsilon(
        DELTA,
        noise_multiplier=1.0,
        batch_size=16,
        records_per_client=600,
        local_steps=38,
        rounds=93,
    )
    assert abs(poisson - 10.82) <= 0.02
    assert abs(exact.upper - 13.88) <= 0.02
    assert exact.lower > poisson + 3.0


def test_discretisation_refinement_agrees():
    # docs/analyses.md: h = 1e-3 vs 1e-4 agree to 0.01; the finer brackets nest.
    kwargs = dict(
        noise_multiplier=1.0,
        batch_size=8,
        records_per_client=600,
        local_steps=76,
        rounds=266,
    )
    coarse = subsampled.exact_epsilon(DELTA, **kwargs)
    fine = subsampled.exact_epsilon(DELTA, value_discretization=1e-4, **kwargs)
    assert abs(coarse.upper - fine.upper) <= 0.01
    assert coarse.lower - 1e-9 <= fine.lower <= fine.upper <= coarse.upper + 1e-9


def test_pessimistic_and_optimistic_one_step_profiles_bracket_closed_form():
    # One step: δ_opt(ε) <= δ_C(ε) <= δ_pess(ε) on a fine ε grid (to 1e-13, the
    # rounding of dp_accounting's sums), and they are within 1e-5 of each other.
    sigma, p = 1.0, 16 / 600
    eps = np.linspace(-7, 7, 20001)
    truth = subsampled.subsampled_gaussian_delta(
        eps, mu=1 / sigma, sampling_probability=p
    )
    pess = subsampled.subsampled_gaussian_pld(
        noise_multiplier=sigma, sampling_probability=p
    )
    opt = subsampled.subsampled_gaussian_pld(
        noise_multiplier=sigma, sampling_probability=p, pessimistic=False
    )
    d_pess = pess.get_delta_for_epsilon(eps)
    d_opt = opt.get_delta_for_epsilon(eps)
    assert np.all(d_opt <= truth + 1e-13)
    assert np.all(truth <= d_pess + 1e-13)
    assert np.max(d_pess - d_opt) < 1e-5


def test_delta_from_tradeoff_matches_gdp_closed_form():
    # δ(ε) = 1 + G_μ*(−e^ε) equals DRS Cor 2.13's closed form, 1e-9 absolute.
    for mu in (0.5, 2.0):
        f = functools.partial(gaussian.gaussian_tradeoff, mu=mu)
        for eps in (-0.5, 0.0, 1.0, 4.0):
            assert fdp.delta_from_tradeoff(eps, f) == pytest.approx(
                gaussian.gdp_delta(eps, mu=mu), abs=1e-9
            )
    assert fdp.delta_from_tradeoff(0.3, fdp.identity_tradeoff) == pytest.approx(
        0.0, abs=1e-15
    )


def test_tradeoff_from_gdp_deltas_recovers_gaussian():
    # f(α) = sup_ε [1 − δ(ε) − e^ε α] with the GDP profile is G_μ (1e-6).
    alpha = np.linspace(0, 1, 51)

    def profile(e):
        return np.array([gaussian.gdp_delta(float(x), mu=1.5) for x in e])

    f = fdp.tradeoff_from_deltas(alpha, profile, epsilons=np.arange(-10, 10, 1e-3))
    assert np.max(np.abs(f - gaussian.gaussian_tradeoff(alpha, mu=1.5))) <= 1e-6


@settings(max_examples=40, deadline=None)
@given(
    mu=st.floats(0.0, 5.0),
    p=st.floats(0.001, 1.0),
    alpha=st.lists(st.floats(0.0, 1.0), min_size=1, max_size=20),
)
def test_subsampled_tradeoff_properties(mu, p, alpha):
    # Properties of C_p(G_μ) (DRS §4): symmetric (f(f(α)) = α), between G_μ and
    # Id, and equal to G_μ at p = 1. Tolerance 1e-9.
    a = np.array(alpha)
    f = fdp.subsampled_tradeoff(a, mu=mu, sampling_probability=p)
    assert np.all(f >= gaussian.gaussian_tradeoff(a, mu=mu) - 1e-9)
    assert np.all(f <= 1 - a + 1e-9)
    back = fdp.subsampled_tradeoff(f, mu=mu, sampling_probability=p)
    assert np.allclose(back, a, atol=1e-7)
    full = fdp.subsampled_tradeoff(a, mu=mu, sampling_probability=1.0)
    assert np.allclose(full, gaussian.gaussian_tradeoff(a, mu=mu), atol=1e-12)


def test_mu_effective_round_trip():
    # mu_effective is the GDP μ through (ε, δ): gdp_delta(ε, μ_eff) = δ (1e-9).
    mu = subsampled.mu_effective(epsilon=13.88, delta=DELTA)
    assert gaussian.gdp_delta(13.88, mu=mu) == pytest.approx(DELTA, rel=1e-9)
    assert abs(mu - 2.60) <= 0.005  # docs/analyses.md row 1


def test_identity_tradeoff():
    assert fdp.identity_tradeoff([0.0, 0.25, 1.0]).tolist() == [1.0, 0.75, 0.0]


def test_weak_and_strong_federated_row_1():
    # Table-1 row 1 with m = 100 clients: sound ε = 13.88 (docs/analyses.md), CLT
    # μ_max = 2.71 (Table 1), paper's strong μ = sqrt(99)·2.711 = 26.97
    # (docs/analyses.md prints 26.96 = sqrt(99)·2.71). Tolerances: printed decimals.
    kwargs = dict(
        noise_multiplier=1.0,
        batch_size=16,
        records_per_client=600,
        local_steps=38,
        rounds=93,
        num_clients=100,
    )
    weak = federated.weak_federated(**kwargs)
    strong = federated.strong_federated(**kwargs)
    for g in (weak, strong):
        assert isinstance(g, Guarantee)
        assert g.unit == "record" and g.neighbouring == "replace-one"
        assert abs(g.values["epsilon"].upper - 13.88) <= 0.02
        assert abs(g.values["mu_clt"] - 2.71) <= 0.005
        assert abs(g.values["mu_effective"] - 2.60) <= 0.005
    assert "one-vs-one" in weak.adversary and "one-vs-all" in strong.adversary
    assert abs(strong.values["mu_paper"] - math.sqrt(99) * 2.711) <= 0.01
    assert strong.values["epsilon_paper"] > 10 * strong.values["epsilon"].upper
    assert "mu_paper" not in weak.values
    assert strong.to_json()["epsilon"] == strong.values["epsilon"].upper


def test_federated_picks_least_private_client():
    # Client 2 has the least noise, so it bounds the federation (Theorem 2,
    # "least private client"); its exact ε equals the single-client value.
    g = federated.weak_federated(
        noise_multiplier=[1.0, 1.0, 0.75],
        batch_size=16,
        records_per_client=[600, 600, 600],
        local_steps=38,
        rounds=64,
    )
    assert g.values["least_private_client"] == 2
    single = subsampled.exact_epsilon(
        DELTA,
        noise_multiplier=0.75,
        batch_size=16,
        records_per_client=600,
        local_steps=38,
        rounds=64,
    )
    assert g.values["epsilon"] == single
    assert abs(g.values["epsilon"].upper - 21.02) <= 0.02  # docs/analyses.md row 3
    assert g.values["num_clients"] == 3


@pytest.mark.parametrize(
    ("call", "kwargs"),
    [
        (
            fdp.clt_mu,
            dict(
                noise_multiplier=1.0,
                batch_size=700,
                records_per_client=600,
                local_steps=1,
                rounds=1,
            ),
        ),
        (
            fdp.clt_mu,
            dict(
                noise_multiplier=0.0,
                batch_size=16,
                records_per_client=600,
                local_steps=1,
                rounds=1,
            ),
        ),
        (
            fdp.clt_mu,
            dict(
                noise_multiplier=1.0,
                batch_size=16,
                records_per_client=600,
                local_steps=0,
                rounds=1,
            ),
        ),
        (
            subsampled.subsampled_gaussian_pld,
            dict(noise_multiplier=1.0, sampling_probability=0.0),
        ),
        (
            subsampled.subsampled_gaussian_pld,
            dict(
                noise_multiplier=1.0,
                sampling_probability=0.5,
                value_discretization=-1e-3,
            ),
        ),
        (fdp.subsampled_tradeoff, dict(alpha=0.5, mu=1.0, sampling_probability=1.5)),
        (subsampled.mu_effective, dict(epsilon=1.0, delta=0.0)),
        (
            federated.strong_federated,
            dict(
                noise_multiplier=1.0,
                batch_size=16,
                records_per_client=600,
                local_steps=38,
                rounds=93,
            ),
        ),
        (
            federated.weak_federated,
            dict(
                noise_multiplier=[1.0, 1.0],
                batch_size=[16] * 3,
                records_per_client=600,
                local_steps=38,
                rounds=93,
            ),
        ),
        (
            subsampled.subsampled_gaussian_delta,
            dict(epsilon=1.0, mu=1.0, sampling_probability=0.5, direction="both"),
        ),
    ],
)
def test_invalid_parameters_raise(call, kwargs):
    with pytest.raises(InvalidParameterError):
        call(**kwargs)


def test_exact_epsilon_rejects_bad_delta():
    with pytest.raises(InvalidParameterError):
        subsampled.exact_epsilon(
            1.5,
            noise_multiplier=1.0,
            batch_size=16,
            records_per_client=600,
            local_steps=38,
            rounds=93,
        )


def test_accounting_modules_do_not_import_torch():
    import subprocess
    import sys

    code = (
        "import sys, dpfl.accounting.fdp, dpfl.accounting.gaussian; "
        "sys.exit(1 if 'torch' in sys.modules else 0)"
    )
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0
