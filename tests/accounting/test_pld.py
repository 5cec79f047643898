"""Tests of dpfl.accounting.pld (generic PLD construction with two-sided bounds)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from dp_accounting.pld import pld_pmf
from dp_accounting.pld import privacy_loss_distribution as dpl
from scipy import integrate, special, stats

from dpfl.accounting import discretise, hockey, pld, refine
from dpfl.errors import InvalidParameterError


def _quad_hockey(pair, eps, sigma):
    """Reference: scipy quad of the positive part of P - e^eps Q."""

    def f(z):
        dens = stats.norm.pdf(z, pair.means, sigma)
        return max(0.0, dens @ pair.weights_p - math.exp(eps) * (dens @ pair.weights_q))

    # adaptive quad on 0.5-wide panels (kinks at the roots stay local)
    lo, hi = pair.means.min() - 14 * sigma, pair.means.max() + 14 * sigma
    edges = np.arange(lo, hi + 0.5, 0.5)
    return math.fsum(
        integrate.quad(f, a, b, limit=200, epsabs=1e-17, epsrel=1e-12)[0]
        for a, b in zip(edges[:-1], edges[1:])
    )


def _gauss_delta(eps, mu):
    """Closed form of D_{e^eps}(N(mu,1) || N(0,1)) (Balle-Wang 2018, Thm 8)."""
    return special.ndtr(mu / 2 - eps / mu) - math.exp(eps) * special.ndtr(
        -mu / 2 - eps / mu
    )


PAIRS = [
    # subsampled Gaussian (remove) and a three-component pair with two roots
    hockey.MixturePair.create([0, 1], [0.7, 0.3], [1.0, 0.0]),
    hockey.MixturePair.create([0, 2, 3], [0.5, 0.2, 0.3], [0.3, 0.6, 0.1]),
    hockey.MixturePair.create(
        [-1, 0, 1.5, 4], [0.1, 0.4, 0.4, 0.1], [0.4, 0.1, 0.1, 0.4]
    ),
]


@pytest.mark.parametrize("pair", PAIRS)
@pytest.mark.parametrize("eps", [-0.7, -0.05, 0.1, 2.0])
def test_mixture_hockey_stick_matches_quadrature(pair, eps):
    # tolerance: 1e-9 relative + 1e-14 absolute; source: scipy.integrate.quad
    for p in (pair, pair.swapped()):
        got = hockey.mixture_hockey_stick(p, [eps], noise_std=0.8)[0][0]
        ref = _quad_hockey(p, eps, 0.8)
        assert got == pytest.approx(ref, rel=1e-9, abs=1e-14)


def test_hockey_stick_finds_every_root():
    # P - e^eps Q with coefficient signs (+, -, +, -, +): four sign changes, and
    # the integrand really has four roots here. Source: quad; tol 1e-9 rel.
    pair = hockey.MixturePair.create(
        [0, 3, 6, 9, 12], [0.3, 0.05, 0.3, 0.05, 0.3], [0.05, 0.425, 0.05, 0.425, 0.05]
    )
    z = np.linspace(-5, 17, 20001)
    dens = stats.norm.pdf(z[:, None], pair.means, 1.0)
    f = dens @ pair.weights_p - dens @ pair.weights_q
    assert np.sum(np.diff(np.sign(f)) != 0) == 4
    got = hockey.mixture_hockey_stick(pair, [0.0], noise_std=1.0)[0][0]
    assert got == pytest.approx(_quad_hockey(pair, 0.0, 1.0), rel=1e-9)


def test_gaussian_pair_matches_closed_form_deep_tail():
    # N(1, s^2) vs N(0, s^2): closed form (Balle-Wang Thm 8) down to 1e-12.
    pair = hockey.MixturePair.create([0, 1], [0, 1], [1, 0])
    for sigma in (0.3, 1.0, 3.0):
        eps = np.linspace(0, 6, 13)
        got = hockey.mixture_hockey_stick(pair, eps, noise_std=sigma)[0]
        ref = np.array([_gauss_delta(e, 1 / sigma) for e in eps])
        big = ref > 1e-12
        np.testing.assert_allclose(got[big], ref[big], rtol=1e-8)


def test_label_mixture_is_weighted_sum():
    # public label: delta = sum_i w_i delta_i (definition); tol 1e-14 abs
    labels = [(0.3, PAIRS[0]), (0.7, PAIRS[1])]
    eps = np.array([-0.2, 0.0, 0.5])
    got = hockey.label_mixture_delta(labels, eps, noise_std=1.1)[0]
    ref = sum(
        w * hockey.mixture_hockey_stick(p, eps, noise_std=1.1)[0] for w, p in labels
    )
    np.testing.assert_allclose(got, ref, rtol=1e-12, atol=1e-14)


def test_connect_dots_matches_dp_accounting():
    # our dense vectorised masses equal dp_accounting's
    # create_pmf_pessimistic_connect_dots on a non-uniform support (tol 1e-12)
    h = 1e-3
    k = np.array([-40, -10, -3, 0, 1, 2, 5, 20, 60, 200])
    pair = PAIRS[0]
    deltas = hockey.mixture_hockey_stick(pair, k * h, noise_std=1.0)[0]
    ours, inf_mass = discretise._connect_dots_probs(h, k, deltas)
    ref = pld_pmf.create_pmf_pessimistic_connect_dots(h, k, deltas)
    ref_probs = np.array([ref._loss_probs.get(int(i), 0.0) for i in k])
    np.testing.assert_allclose(ours, ref_probs, rtol=1e-12, atol=1e-15)
    assert inf_mass == pytest.approx(ref._infinity_mass, rel=1e-12)


@pytest.mark.parametrize("count", [1, 4, 100])
def test_gaussian_composition_brackets_closed_form(count):
    # T-fold Gaussian with sigma is Gaussian with sigma / sqrt(T): exact delta
    # (Balle-Wang). Upper >= exact >= lower, and the gap is below 1e-2 relative
    # (support gaps of 1% of eps at eps ~ 1 where delta ~ 1e-6).
    sigma = 4.0
    labels = [(1.0, hockey.MixturePair.create([0, 1], [0, 1], [1, 0]))]
    up, lo = discretise.pld_bounds_from_label_mixture(
        labels, noise_std=sigma, value_discretization=1e-4, relative_spacing=0.01
    )
    cu, cl = pld.compose_bounds(up, lo, count)
    mu = math.sqrt(count) / sigma
    for eps in (0.05, 0.3, 1.0):
        exact = _gauss_delta(eps, mu)
        b = pld.delta_bound(cu, cl, eps)
        assert b.lower <= exact <= b.upper
        assert b.upper - b.lower <= 1e-2 * exact


def test_epsilon_bound_brackets_gaussian():
    # eps(delta) of G_mu by bisection on the closed form; bracket holds.
    sigma, count, delta = 2.0, 25, 1e-5
    labels = [(1.0, hockey.MixturePair.create([0, 1], [0, 1], [1, 0]))]
    up, lo = discretise.pld_bounds_from_label_mixture(
        labels, noise_std=sigma, value_discretization=1e-4
    )
    b = pld.epsilon_bound(*pld.compose_bounds(up, lo, count), delta)
    mu = math.sqrt(count) / sigma
    lo_e, hi_e = 0.0, 50.0
    for _ in range(200):
        mid = 0.5 * (lo_e + hi_e)
        lo_e, hi_e = (mid, hi_e) if _gauss_delta(mid, mu) > delta else (lo_e, mid)
    assert b.lower <= hi_e + 1e-12 and lo_e - 1e-12 <= b.upper
    assert b.gap < 1e-3


def test_subsampled_gaussian_matches_dp_accounting():
    # Poisson-subsampled Gaussian, 50 rounds: dp_accounting's PLD at a fine grid
    # lies inside our bracket widened by dp_accounting's own discretisation
    # error (its values at 5e-5 and 1e-5 differ by < 2e-4 relative).
    sigma, rate, count = 1.0, 0.05, 50
    labels = [(1.0, hockey.MixturePair.create([0, 1], [1 - rate, rate], [1, 0]))]
    up, lo = discretise.pld_bounds_from_label_mixture(labels, noise_std=sigma)
    b = pld.epsilon_bound(*pld.compose_bounds(up, lo, count), 1e-6)
    ref = dpl.from_gaussian_mechanism(
        sigma, sampling_prob=rate, value_discretization_interval=5e-5
    ).self_compose(count)
    e_ref = ref.get_epsilon_for_delta(1e-6)
    assert b.lower * (1 - 2e-4) <= e_ref <= b.upper * (1 + 2e-4)
    assert b.gap < 0.005


def test_self_compose_matches_dp_accounting():
    # our certified self-composition vs dp_accounting's FFT on the same PMF:
    # dp_accounting's delta lies in our certified [lower, upper] (both read
    # off the same composition), which is at most 1e-9 wide relative; the
    # pointwise envelope (what generic PMF code reads) is an upper value
    # within 1e-7.
    labels = [(1.0, PAIRS[0])]
    up = discretise.pld_from_label_mixture(
        labels, noise_std=1.0, value_discretization=1e-3
    )
    ours = pld.self_compose(up, 20)
    ref = up.self_compose(20)
    for eps in (0.1, 0.5, 1.0):
        for pmf, theirs in (
            (ours._pmf_remove, ref._pmf_remove),
            (ours._pmf_add, ref._pmf_add),
        ):
            r = theirs.get_delta_for_epsilon(eps)
            lo, hi = pmf.delta_lower(eps), pmf.delta_upper(eps)
            assert lo <= r * (1 + 1e-12) and r <= hi * (1 + 1e-12)
            assert hi - lo <= 1e-9 * r
            assert r <= pmf.get_delta_for_epsilon(eps) <= r * (1 + 1e-7)


def test_pld_from_delta_curve_gaussian():
    # connect-the-dots from the exact Gaussian curve; upper bound and tight.
    mu = 0.5
    fn = np.vectorize(lambda e: _gauss_delta(e, mu))
    p = discretise.pld_from_delta_curve(
        fn, value_discretization=1e-4, eps_range=(-6.0, 6.0), relative_spacing=0.005
    )
    comp = pld.self_compose(p, 16)
    exact = _gauss_delta(1.0, mu * 4)
    got = comp.get_delta_for_epsilon(1.0)
    assert exact <= got <= exact * (1 + 1e-3)


def test_refine_bound_reports_gap():
    labels = [(1.0, PAIRS[0])]

    def build(h):
        return discretise.pld_bounds_from_label_mixture(
            labels, noise_std=1.0, value_discretization=h
        )

    res = refine.refine_bound(
        build, count=10, delta=1e-5, tolerance=0.01, initial_discretization=1e-3
    )
    assert res.converged and res.gap <= 0.01
    assert res.bound.lower <= res.bound.upper
    with pytest.raises(InvalidParameterError):
        refine.refine_bound(build, count=10)


def test_mixture_pair_validation():
    with pytest.raises(InvalidParameterError, match="weights_p"):
        hockey.MixturePair.create([0, 1], [0.5, 0.6], [1, 0])
    with pytest.raises(InvalidParameterError):
        hockey.MixturePair.create([0, 1], [-0.5, 1.5], [1, 0])
    with pytest.raises(InvalidParameterError, match="noise_std"):
        discretise.pld_from_label_mixture([(1.0, PAIRS[0])], noise_std=0.0)
    merged = hockey.MixturePair.create([0, 0, 1], [0.5, 0.25, 0.25], [0.5, 0.5, 0.0])
    assert merged.means.tolist() == [0.0, 1.0]
    assert merged.weights_p.tolist() == [0.75, 0.25]
