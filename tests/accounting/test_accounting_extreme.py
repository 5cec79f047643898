"""Accounting at extreme but valid parameters: every case answers, soundly.

Seven Poisson-subsampled Gaussian cases that failed before (three named in
issue 16: MemoryError or a 7 GiB request; four from the seeded grid of
benchmarks/accounting_grid.py, seed 16: MemoryError or over 40 s), and the
case whose bracket had collapsed onto a value below the truth. Each must
answer without error, name the path that answered, and its bracket must
agree with values computed independently of the PLD composition:

* q = 1: the exact epsilon of the composed Gaussian (mu = sqrt(T) / sigma),
  from the closed form delta(eps) = Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu -
  mu/2) (Dong, Roth and Su 2022, Corollary 2.13) written here in log space
  and solved by bisection; it must lie in [lower, upper] within 1e-9
  relative (the closed form's floating-point accuracy).
* q < 1, a lower bound: the adversary that sees only the sum of the T
  releases (a post-processing, so its epsilon is at most the true one). In
  the remove direction the sum is N(0, T sigma^2) without the record and the
  Binomial(T, q) mixture of N(k, T sigma^2) with it; its hockey-stick
  divergence is computed here exactly (one crossing point). It must not
  exceed ``upper`` (relative tolerance 1e-9).
* q < 1, an upper bound: Renyi DP of the sampled Gaussian (Mironov, Talwar
  and Zhang 2019) composed T times by dp_accounting's RDP accountant. It
  must not be below ``lower`` (relative tolerance 1e-9).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from dp_accounting import dp_event
from dp_accounting.rdp import rdp_privacy_accountant
from scipy import optimize, special, stats

from dpfl.accounting import discretise, hockey, pld, refine
from dpfl.accounting.accountant import Accountant
from dpfl.accounting.events import Gaussian, PoissonSampled

RTOL = 1e-9


# -- independent values ---------------------------------------------------------
def _log_gdp_delta(eps: float, mu: float) -> float:
    a = -eps / mu + mu / 2.0
    b = -eps / mu - mu / 2.0
    la, lb = special.log_ndtr(a), eps + special.log_ndtr(b)
    return float(la + np.log(-np.expm1(lb - la)))


def exact_gaussian_epsilon(sigma: float, rounds: int, delta: float) -> float:
    mu = math.sqrt(rounds) / sigma
    hi = 1.0
    while _log_gdp_delta(hi, mu) > math.log(delta):
        hi *= 2.0
    return float(
        optimize.brentq(
            lambda e: _log_gdp_delta(e, mu) - math.log(delta), 0.0, hi, xtol=1e-13
        )
    )


def sum_statistic_epsilon(sigma: float, q: float, rounds: int, delta: float) -> float:
    """Epsilon of the sum of the T releases alone: a lower bound on the truth."""
    s = sigma * math.sqrt(rounds)
    k = np.arange(rounds + 1)
    logw = stats.binom.logpmf(k, rounds, q)
    keep = logw > -80.0
    k, logw = k[keep].astype(float), logw[keep]

    def log_ratio(z: float) -> float:  # log dP/dQ at z, increasing in z
        return float(special.logsumexp(logw + (k * z - 0.5 * k * k) / s**2))

    def log_delta(eps: float) -> float:
        lo, hi = -50.0 * s, 50.0 * s + k.max()
        z = optimize.brentq(lambda x: log_ratio(x) - eps, lo, hi, xtol=1e-12)
        p = special.logsumexp(logw + special.log_ndtr(-(z - k) / s))
        qq = eps + special.log_ndtr(-z / s)
        return float(p + np.log(-np.expm1(qq - p))) if qq < p else -math.inf

    if log_delta(0.0) <= math.log(delta):
        return 0.0
    hi = 1.0
    while log_delta(hi) > math.log(delta):
        hi *= 2.0
    return float(
        optimize.brentq(lambda e: log_delta(e) - math.log(delta), 0.0, hi, xtol=1e-10)
    )


def rdp_epsilon(sigma: float, q: float, rounds: int, delta: float) -> float:
    acc = rdp_privacy_accountant.RdpAccountant()
    acc.compose(
        dp_event.PoissonSampledDpEvent(q, dp_event.GaussianDpEvent(sigma)), rounds
    )
    return float(acc.get_epsilon(delta))


def _bound(sigma: float, q: float, rounds: int, delta: float):
    return (
        Accountant().compose(PoissonSampled(q, Gaussian(sigma)), rounds).epsilon(delta)
    )


# -- the seven cases --------------------------------------------------------------
# (sigma, q, T, delta, what main did)
EXACT = [
    (0.67, 1.0, 18_886, 1e-5, "issue 16: MemoryError"),
    (10.57, 1.0, 76_392, 2.3e-6, "grid case 67: MemoryError"),
]
SUBSAMPLED = [
    (0.40, 0.017, 54_267, 1e-5, "issue 16: MemoryError"),
    (1.18, 0.68, 91_610, 1e-5, "issue 16: asked for 7.15 GiB"),
    (0.4137, 0.0446, 10_225, 1.6e-9, "grid case 6: over 40 s"),
    (2.239, 0.119, 16_566, 4.6e-9, "grid case 58: over 40 s"),
    (0.5025, 0.698, 484, 0.004, "grid case 49: over 40 s"),
]


@pytest.mark.parametrize(("sigma", "q", "rounds", "delta", "before"), EXACT)
def test_sampling_one_is_the_exact_gaussian(sigma, q, rounds, delta, before):
    b = _bound(sigma, q, rounds, delta)
    assert b.method == "gaussian-exact"
    ref = exact_gaussian_epsilon(sigma, rounds, delta)
    assert b.lower * (1 - RTOL) <= ref <= b.upper * (1 + RTOL), (b, ref)
    assert b.lower < b.upper  # a margin, never a bare point
    assert b.gap < 1e-9


@pytest.mark.slow
@pytest.mark.parametrize(("sigma", "q", "rounds", "delta", "before"), SUBSAMPLED)
def test_extreme_subsampled_cases_answer_within_independent_bounds(
    sigma, q, rounds, delta, before
):
    b = _bound(sigma, q, rounds, delta)
    assert b.method in ("pld", "pld-coarse", "rdp-fallback")
    assert 0.0 < b.lower < b.upper < math.inf
    indep_lower = sum_statistic_epsilon(sigma, q, rounds, delta)
    indep_upper = rdp_epsilon(sigma, q, rounds, delta)
    assert indep_lower <= b.upper * (1 + RTOL), (b, indep_lower)
    assert b.lower <= indep_upper * (1 + RTOL), (b, indep_upper)
    assert b.upper <= indep_upper * (1 + RTOL)  # never worse than the RDP bound


# -- the collapsed bracket ----------------------------------------------------
@pytest.mark.slow
def test_tiny_delta_bracket_holds_the_independent_references():
    """sigma 0.535, q 1.03e-5, T 67, delta 2.9e-10 (issue 16), at a point where
    the optimistic eps came out above the pessimistic one before (0.3086564
    above 0.3086557) and the bracket was clipped to one value.

    The FFT round-off is now bounded a priori (dpfl.accounting.tilted), so the
    bracket needs no estimated margin; it must hold the independent values:
    dp_accounting's own PLDs of the same mechanism, pessimistic at grid 1e-4
    (an upper value: our lower must not exceed it) and optimistic at 2e-5 (a
    lower estimate: our upper must not be below it), relative tolerance 1e-9.
    (At grid 1e-6 both lie inside the bracket, but take minutes.)
    """
    from dp_accounting.pld import privacy_loss_distribution as pl

    sigma, q, rounds, delta = 0.535107, 1.03229e-5, 67, 2.904e-10
    b = _bound(sigma, q, rounds, delta)
    assert b.method in ("pld", "pld-coarse")
    assert b.lower < b.upper
    refs = {}
    for pessimistic, h in ((True, 1e-4), (False, 2e-5)):
        refs[pessimistic] = (
            pl.from_gaussian_mechanism(
                sigma,
                sampling_prob=q,
                value_discretization_interval=h,
                pessimistic_estimate=pessimistic,
                use_connect_dots=pessimistic,
            )
            .self_compose(rounds)
            .get_epsilon_for_delta(delta)
        )
    assert b.lower <= refs[True] * (1 + RTOL), (b, refs)
    assert refs[False] <= b.upper * (1 + RTOL), (b, refs)


def test_crossed_bracket_is_never_clipped_to_a_point():
    """An optimistic PLD whose eps exceeds the pessimistic one (what roundoff
    did in issue 16) must give the hull of the two, not min(lower, upper)
    collapsed onto the upper value. (Plain PMFs are read as exact, with only
    the reading's rounding margin, at most 4 (n + 2) u relative in delta:
    1e-12 relative in eps here.)"""
    from dp_accounting.pld import pld_pmf
    from dp_accounting.pld.privacy_loss_distribution import (
        PrivacyLossDistribution as PLD,
    )

    h = 1e-2
    probs = np.zeros(301)
    probs[[0, 100, 200, 300]] = [0.7, 0.2, 0.0999, 1e-4]
    low = PLD(pld_pmf.DensePLDPmf(h, 0, probs, 0.0, False))
    shifted = PLD(pld_pmf.DensePLDPmf(h, -5, probs, 0.0, True))  # losses lower
    b = pld.epsilon_bound(shifted, low, 1e-3)
    eu = pld.pmf_epsilon_for_delta(shifted._pmf_remove, 1e-3)
    el = pld.pmf_epsilon_for_delta(low._pmf_remove, 1e-3)
    assert el > eu  # crossed on purpose
    assert b.upper == pytest.approx(el, rel=1e-12)
    assert b.lower == pytest.approx(eu, rel=1e-12)
    assert b.lower < b.upper


# -- the pieces ---------------------------------------------------------------
def test_rebin_rounds_pessimistic_up_and_optimistic_down():
    """delta(eps) is monotone in every loss: a coarser pessimistic PMF lies on
    or above the fine one at every eps, an optimistic one on or below (exact
    float comparison up to 1e-15 absolute, summation order)."""
    up, lo = discretise.pld_bounds_from_label_mixture(
        [(1.0, hockey.MixturePair.create([0.0, 1.0], [0.9, 0.1], [1.0, 0.0]))],
        noise_std=0.8,
        value_discretization=1e-3,
    )
    eps = np.linspace(-1.0, 6.0, 57)
    for p, sign in ((up, 1.0), (lo, -1.0)):
        fine = p._pmf_remove.to_dense_pmf()
        coarse = pld._rebin(fine, 16)
        assert coarse._discretization == pytest.approx(16e-3)
        diff = coarse.get_delta_for_epsilon(eps) - fine.get_delta_for_epsilon(eps)
        assert np.all(sign * diff >= -1e-15)
        assert np.max(np.abs(diff)) > 1e-6  # it did move something


def test_memory_cap_coarsens_and_the_coarse_bracket_holds_the_fine_one(monkeypatch):
    """With the composed-size cap lowered to 2^14 points, a composition that
    needs more comes back on a coarser grid, labelled 'pld-coarse', and its
    (wider) bracket overlaps the fine bracket computed without the cap."""
    acc = Accountant().compose(PoissonSampled(0.05, Gaussian(0.9)), 2_000)
    fine = acc.epsilon(1e-6)
    assert fine.method == "pld"
    monkeypatch.setattr(pld, "MAX_COMPOSED_POINTS", 1 << 14)
    coarse = (
        Accountant().compose(PoissonSampled(0.05, Gaussian(0.9)), 2_000).epsilon(1e-6)
    )
    assert coarse.method in ("pld-coarse", "rdp-fallback")
    assert coarse.lower <= fine.upper and fine.lower <= coarse.upper
    assert coarse.upper >= fine.lower and coarse.gap >= fine.gap


def test_vectorised_epsilon_matches_dp_accounting():
    """pld.pmf_epsilon_for_delta against dp_accounting's loop on random PMFs
    (seeded; 1e-9 relative: both are exact formulas in float64)."""
    from dp_accounting.pld import pld_pmf

    rng = np.random.default_rng(16)
    for _ in range(60):
        n = int(rng.integers(1, 400))
        p = rng.random(n) ** 8
        p /= p.sum() * (1 + 0.01 * rng.random())
        inf = float(1e-3 * rng.random()) if rng.random() < 0.5 else 0.0
        pmf = pld_pmf.DensePLDPmf(
            float(10 ** rng.uniform(-4, 0)), int(rng.integers(-300, 300)), p, inf, True
        )
        for d in (1e-10, 1e-6, 1e-3, 0.1, 0.5):
            ref = pmf.get_epsilon_for_delta(d)
            got = pld.pmf_epsilon_for_delta(pmf, d)
            assert got == ref or abs(got - ref) <= 1e-9 * max(1.0, abs(ref))


def test_rdp_fallback_is_labelled_and_certified(monkeypatch):
    """Where the PLD bracket cannot converge (cap forced to 2^10 points) and
    the closed fallback is smaller, it answers the upper value and says so.
    The fallback (RDP over more orders, or the unsampled Gaussian's closed
    form) is never above dp_accounting's RDP at its default orders (1e-12),
    never below the sum-statistic lower bound, and the PLD's lower value
    stays below it."""
    monkeypatch.setattr(pld, "MAX_COMPOSED_POINTS", 1 << 10)
    sigma, q, rounds, delta = 1.0, 0.01, 10_000, 1e-6
    b = _bound(sigma, q, rounds, delta)
    ref = rdp_epsilon(sigma, q, rounds, delta)
    assert b.method in ("rdp-fallback", "pld-coarse")
    assert b.upper <= ref * (1 + 1e-12)
    assert sum_statistic_epsilon(sigma, q, rounds, delta) <= b.upper * (1 + RTOL)
    assert b.lower < b.upper


def test_memory_error_falls_back_to_rdp_labelled_without_lower(monkeypatch):
    """If the PLD still ran out of memory, the closed fallback answers above
    and 0 below, and the method says there is no lower bound (never above
    dp_accounting's RDP accountant at its default orders, 1e-12)."""

    def boom(*args, **kwargs):
        raise MemoryError

    monkeypatch.setattr(refine, "refine_parts", boom)
    b = _bound(1.0, 0.01, 1_000, 1e-6)
    assert b.method == "rdp-fallback-no-lower"
    assert b.lower == 0.0
    ref = rdp_epsilon(1.0, 0.01, 1_000, 1e-6)
    assert sum_statistic_epsilon(1.0, 0.01, 1_000, 1e-6) <= b.upper <= ref * (1 + 1e-12)


def test_a_threshold_stops_refining_once_the_side_is_known() -> None:
    # Calibration asks only whether epsilon falls below its target, so the
    # Accountant's threshold stops the grid refinement as soon as the bracket
    # is on one side of it. Reference: the same query without a threshold
    # (refined to the tolerance); both brackets are certified, so they
    # overlap, and the side of each threshold agrees with the reference's.
    from dpfl.accounting import refine
    from dpfl.accounting.accountant import Accountant
    from dpfl.accounting.events import ClientPoisson, Gaussian, RecordPoisson

    event = ClientPoisson(0.05, RecordPoisson(0.1, 20, Gaussian(1.2)))
    grids: list[float] = []
    original = refine.bracket_parts

    def counted(*args, **kw):  # type: ignore[no-untyped-def]
        out = original(*args, **kw)
        grids.append(out[1])
        return out

    def query(threshold: float | None) -> tuple[object, int]:
        grids.clear()
        refine.bracket_parts = counted
        try:
            acc = Accountant("sound", tolerance=1e-3, threshold=threshold)
            bound = acc.compose(event, 300).epsilon(1e-9)
        finally:
            refine.bracket_parts = original
        return bound, len(grids)

    full, full_grids = query(None)
    for threshold in (0.5 * full.lower, 2.0 * full.upper):
        fast, fast_grids = query(threshold)
        assert fast.lower <= full.upper and full.lower <= fast.upper
        assert (fast.upper <= threshold) == (full.upper <= threshold)
        assert (fast.lower > threshold) == (full.lower > threshold)
        assert fast_grids < full_grids
