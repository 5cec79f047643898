"""The certified (tilted) FFT composition of dpfl.accounting.tilted.

References are exact: integer (rational) convolutions in Python, and binomial
laws summed with mpmath at 50 digits. Nothing here compares dpfl with itself.
"""

from __future__ import annotations

import math
from fractions import Fraction

import mpmath as mp
import numpy as np
import pytest
from dp_accounting.pld import pld_pmf

from dpfl.accounting import envelope, lossdists, tilted


def _exact_power(numerators: list[int], count: int) -> list[int]:
    """Integer coefficients of (sum_k a_k x^k)^count (exact)."""
    out = [1]
    for _ in range(count):
        nxt = [0] * (len(out) + len(numerators) - 1)
        for i, a in enumerate(out):
            if a:
                for j, b in enumerate(numerators):
                    nxt[i + j] += a * b
        out = nxt
    return out


@pytest.mark.parametrize("tilt", [0.0, 2.0])
def test_envelopes_hold_every_exact_mass(tilt):
    # A PMF of 40 dyadic masses (exactly representable, summing to 1) composed
    # 20 times: the exact composition in integers. The pessimistic envelope is
    # >= every exact mass and the optimistic one <= it (float comparison of the
    # exact rational, no tolerance), on a window that cuts both tails (so the
    # aliasing and the Chernoff lumps are exercised). On the whole support the
    # measured error of the raw output is far below the stated bound of the
    # FFT's error (< 1e-2 of it).
    rng = np.random.default_rng(23)
    bits = 30
    raw = rng.integers(1, 2**12, size=40).astype(np.int64)
    raw[rng.random(40) < 0.3] = 0
    raw[0] += 1
    nums = (raw * (2**bits // int(raw.sum()))).tolist()
    nums[0] += 2**bits - sum(nums)
    probs = np.array([Fraction(n, 2**bits) for n in nums], dtype=float)
    h, lower, count = 0.05, -7, 20
    exact = _exact_power(nums, count)
    denom = 2 ** (bits * count)
    for pess in (True, False):
        dist = lossdists.Dist(pld_pmf.DensePLDPmf(h, lower, probs, 0.0, pess))
        window = tilted.Plan(tilt, (lower * count + 150) * h, (lower * count + 600) * h)
        out = tilted.compose([(dist, count)], window)
        env = np.asarray(out._probs)
        start = out._lower_loss - lower * count
        for s in range(env.size):
            true = Fraction(exact[start + s], denom)
            if pess:
                assert float(true) <= env[s] or true <= Fraction(env[s])
            else:
                assert Fraction(env[s]) <= true
        assert 0 < out.alias  # the cut window did alias
    # Untilted, on the whole support (no aliasing): the raw output against the
    # exact composition, far below the stated bound of the FFT's error.
    dist = lossdists.Dist(pld_pmf.DensePLDPmf(h, lower, probs, 0.0, True))
    whole = tilted.Plan(0.0, lower * count * h, (lower + 39) * count * h)
    out = tilted.compose([(dist, count)], whole)
    assert out.alias == 0.0 and out.raw.size == len(exact)
    err = max(
        abs(out.raw[s] - float(Fraction(exact[s], denom))) for s in range(len(exact))
    )
    assert err <= 1e-2 * out.error


def _binomial_delta(eps: float, count: int, p: float, step: float) -> float:
    """delta(eps) of the count-fold composition of {0 w.p. 1-p, step w.p. p}."""
    mp.mp.dps = 50
    total = mp.mpf(0)
    p = mp.mpf(p)
    for k in range(count + 1):
        loss = k * step
        if loss <= eps:
            continue
        w = mp.binomial(count, k) * p**k * (1 - p) ** (count - k)
        total += w * (1 - mp.e ** (mp.mpf(eps) - loss))
    return float(total)


@pytest.mark.parametrize("delta", [1e-6, 1e-14, 1e-30])
def test_certified_epsilon_at_tiny_delta_brackets_an_exact_binomial(delta):
    # Losses 0 (w.p. 0.98) and 0.5 (w.p. 0.02), composed 400 times: the
    # composed loss is 0.5 Binom(400, 0.02), whose delta(eps) mpmath sums
    # exactly. The certified epsilon bracket at delta = 1e-6, 1e-14 and 1e-30
    # holds the exact delta on both sides (exact delta at the upper value <=
    # delta < exact delta at the lower value), and is tight: within 1e-6 of
    # delta at the upper value (an untilted FFT's floor is ~1e-16 absolute,
    # far above 1e-30).
    h, count, p = 0.05, 400, 0.02
    probs = np.zeros(11)
    probs[0], probs[10] = 1 - p, p
    pmf_up = pld_pmf.DensePLDPmf(h, 0, probs, 0.0, True)
    pmf_lo = pld_pmf.DensePLDPmf(h, 0, probs, 0.0, False)
    up, lo = lossdists.Dist(pmf_up), lossdists.Dist(pmf_lo)
    plan = tilted.plan([(up, count)], delta=delta, partners=[(lo, count)])
    cu = tilted.compose([(up, count)], plan)
    cl = tilted.compose([(lo, count)], plan)
    e_up, e_lo = cu.epsilon_upper(delta), cl.epsilon_lower(delta)
    assert e_lo < e_up < math.inf
    assert _binomial_delta(e_up, count, p, 10 * h) <= delta
    assert _binomial_delta(e_lo, count, p, 10 * h) > delta
    # the upper delta at the upper epsilon is the exact one within 1e-6
    exact_at = _binomial_delta(e_up, count, p, 10 * h)
    assert cu.delta_upper(e_up) <= exact_at * (1 + 1e-6) + 1e-300
    assert cl.delta_lower(e_up) >= exact_at * (1 - 1e-6)


def test_fft_error_factor_is_the_stated_bound():
    # eta_L = 16 u log2(L), u = 2^-53 (the module's stated assumption).
    assert tilted.fft_error_factor(2**20) == pytest.approx(16 * 2.0**-53 * 20)
    assert envelope.summation_margin(1000) == pytest.approx(4 * 1002 * 2.0**-53)


def _trinomial_delta(eps: float, count: int, p1: float, p2: float, big: int, h: float):
    """delta(eps) of ``count`` rounds of loss 0, h (w.p. p1) or big h (w.p. p2).

    Summed over the multinomial law in log space (float64, lgamma): each term's
    relative error is about 1e-12, far below the brackets compared with it.
    Large-loss counts above 200 (mean ``count p2`` = 0.6 here) carry less than
    1e-300 and are left out.
    """
    from scipy.special import gammaln

    lp0, lp1, lp2 = math.log1p(-p1 - p2), math.log(p1), math.log(p2)
    terms = []
    for k2 in range(min(count, 200) + 1):
        k1 = np.arange(count - k2 + 1)
        loss = (k1 + k2 * big) * h
        keep = loss > eps
        k1, loss = k1[keep], loss[keep]
        logw = (
            gammaln(count + 1)
            - gammaln(k1 + 1)
            - gammaln(k2 + 1)
            - gammaln(count - k1 - k2 + 1)
            + k1 * lp1
            + k2 * lp2
            + (count - k1 - k2) * lp0
        )
        terms.extend(np.exp(logw) * -np.expm1(eps - loss))
    return math.fsum(terms)


@pytest.mark.parametrize("delta", [1e-5, 1e-9])
def test_a_smaller_tilt_shortens_a_heavy_tailed_window_and_still_brackets(delta):
    # One round: loss 0, 3e-4 (w.p. 0.3) or 1.5 (w.p. 2e-4), 3000 rounds. Tilted
    # for the answer, the rare large loss gives the tilted composition a long
    # right tail, and the window that holds it is twice the one a smaller tilt
    # needs (error_share). Both brackets hold the exact multinomial delta (to
    # 1e-10 of it, the reference's rounding) and the smaller tilt moves the
    # upper end by less than 1e-6 of itself.
    h, big, p1, p2, count = 3e-4, 5000, 0.3, 2e-4, 3000
    probs = np.zeros(big + 1)
    probs[0], probs[1], probs[big] = 1 - p1 - p2, p1, p2
    up = lossdists.Dist(pld_pmf.DensePLDPmf(h, 0, probs, 0.0, True))
    lo = lossdists.Dist(pld_pmf.DensePLDPmf(h, 0, probs, 0.0, False))
    ends, lengths = {}, {}
    for share in (None, 1e-4):
        plan = tilted.plan(
            [(up, count)], delta=delta, partners=[(lo, count)], error_share=share
        )
        lengths[share] = tilted.window_length([(up, count)], plan)
        e_up = tilted.compose([(up, count)], plan).epsilon_upper(delta)
        e_lo = tilted.compose([(lo, count)], plan).epsilon_lower(delta)
        assert e_lo <= e_up < math.inf
        assert _trinomial_delta(e_up, count, p1, p2, big, h) <= delta * (1 + 1e-10)
        assert _trinomial_delta(e_lo, count, p1, p2, big, h) >= delta * (1 - 1e-10)
        ends[share] = e_up
    assert lengths[1e-4] * 2 <= lengths[None]
    assert ends[1e-4] == pytest.approx(ends[None], rel=1e-6)
