"""Balle et al. 2020, Theorem 3.2 (random check-ins into a fixed window).

Reference values are recomputed independently from the theorem's statement
with mpmath at 50 digits; tolerances are 1e-12 relative (float64 evaluation of
the same closed form).
"""

from __future__ import annotations

import math

import mpmath
import pytest

from dpfl.accounting import checkins_balle as cb
from dpfl.accounting import gaussian
from dpfl.errors import InvalidParameterError

mpmath.mp.dps = 50


def _mp_epsilon(p0: str, e0: str, m: int, delta: str) -> float:
    # ε = 7 p0 ε0 sqrt(log(1/δ) / m)
    p0m, e0m, dm = mpmath.mpf(p0), mpmath.mpf(e0), mpmath.mpf(delta)
    return float(7 * p0m * e0m * mpmath.sqrt(mpmath.log(1 / dm) / m))


def _mp_max_local_delta(e0: str, d1: str) -> float:
    # (1 - e^{-ε0}) δ1 / (4 e^{ε0} (2 + ln(2/δ1) / ln(1/(1 - e^{-5 ε0}))))
    e, d = mpmath.mpf(e0), mpmath.mpf(d1)
    log_term = mpmath.log(1 / (1 - mpmath.exp(-5 * e)))
    return float(
        (1 - mpmath.exp(-e))
        * d
        / (4 * mpmath.exp(e) * (2 + mpmath.log(2 / d) / log_term))
    )


@pytest.mark.parametrize(
    ("p0", "e0", "m", "delta"),
    [
        ("0.1", "0.5", 100, "1e-5"),
        ("1", "1", 1, "0.01"),
        ("0.003", "0.05", 10**6, "1e-12"),
    ],
)
def test_epsilon_matches_the_statement(p0, e0, m, delta):
    got = cb.fixed_window_epsilon(
        float(delta), local_epsilon=float(e0), checkin_probability=float(p0), steps=m
    )
    assert got == pytest.approx(_mp_epsilon(p0, e0, m, delta), rel=1e-12)


def test_hand_computed_value():
    # 7 · 0.1 · 0.5 · sqrt(ln(1e5) / 100) = 0.35 · sqrt(0.1151293) = 0.35 · 0.3393071
    # = 0.1187575 (by hand, 7 figures)
    got = cb.fixed_window_epsilon(
        1e-5, local_epsilon=0.5, checkin_probability=0.1, steps=100
    )
    assert got == pytest.approx(0.1187575, abs=1e-7)


@pytest.mark.parametrize(("e0", "d1"), [("1", "1e-3"), ("0.1", "1e-8"), ("0.5", "0.5")])
def test_max_local_delta_matches_the_statement(e0, d1):
    got = cb.max_local_delta(float(e0), float(d1))
    assert got == pytest.approx(_mp_max_local_delta(e0, d1), rel=1e-12)


def test_monotone():
    kw = {"local_epsilon": 0.5, "checkin_probability": 0.1, "steps": 100}
    base = cb.fixed_window_epsilon(1e-5, **kw)
    assert cb.fixed_window_epsilon(1e-7, **kw) > base  # smaller δ, larger ε
    assert cb.fixed_window_epsilon(1e-5, **{**kw, "steps": 400}) == pytest.approx(
        base / 2
    )
    assert cb.fixed_window_epsilon(1e-5, **{**kw, "checkin_probability": 0.2}) > base
    assert cb.fixed_window_epsilon(1e-5, **{**kw, "local_epsilon": 0.9}) > base
    # the admissible δ0 grows with δ1
    assert cb.max_local_delta(0.5, 1e-3) > cb.max_local_delta(0.5, 1e-6)


def test_approx_adds_the_slack_and_checks_delta0():
    kw = {"checkin_probability": 0.1, "steps": 10}
    limit = cb.max_local_delta(1.0, 1e-4)
    eps, total = cb.fixed_window_approx(
        1e-5, local_epsilon=1.0, local_delta=limit, delta1=1e-4, **kw
    )
    assert eps == cb.fixed_window_epsilon(1e-5, local_epsilon=1.0, **kw)
    assert total == pytest.approx(1e-5 + 10 * (math.exp(eps) + 1) * 1e-4, rel=1e-14)
    with pytest.raises(cb.TheoremConditionError, match="local_delta must be <="):
        cb.fixed_window_approx(
            1e-5, local_epsilon=1.0, local_delta=limit * 1.01, delta1=1e-4, **kw
        )


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"local_epsilon": 1.5}, "local_epsilon must be <= 1"),
        ({"delta": 0.02}, "delta must be <= 0.01"),
        ({"checkin_probability": 0.0}, "checkin_probability must be in"),
        ({"steps": 0}, "steps must be >= 1"),
        ({"local_epsilon": -1.0}, "local_epsilon must be > 0"),
    ],
)
def test_validity_conditions(kwargs, match):
    args = {
        "delta": 1e-5,
        "local_epsilon": 0.5,
        "checkin_probability": 0.1,
        "steps": 10,
    }
    args.update(kwargs)
    delta = args.pop("delta")
    with pytest.raises(InvalidParameterError, match=match):
        cb.fixed_window_epsilon(delta, **args)


def test_theorem_conditions_are_their_own_error():
    with pytest.raises(cb.TheoremConditionError):
        cb.fixed_window_epsilon(
            1e-5, local_epsilon=2.0, checkin_probability=0.1, steps=1
        )


def test_gaussian_reading_is_certified_by_the_theorem():
    # Re-derive the returned ε' from a point the theorem accepts: some ε0 <= 1 on
    # the grid, the smallest δ1 admitting the Gaussian δ0, and a δ <= 1/100 with
    # δ + m (e^ε' + 1) δ1 <= δ'.
    sigma, p0, m, target = 30.0, 0.1, 1, 1e-5
    eps = cb.gaussian_fixed_window_epsilon(
        target, noise_multiplier=sigma, checkin_probability=p0, steps=m
    )
    assert math.isfinite(eps)
    certified = False
    for k in range(1, 201):
        e0 = k / 200
        delta = math.exp(
            -((eps / (7 * p0 * e0)) ** 2) * m
        )  # invert ε = 7 p0 ε0 √(ln(1/δ)/m)
        if delta > cb.MAX_DELTA:
            continue
        d0 = gaussian.delta_for_epsilon(e0, noise_multiplier=sigma, sensitivity=2.0)
        # the smallest δ1 is found by bisection; accept it within 1e-9 relative
        for d1 in (10.0**j for j in range(-300, 0)):
            if cb.max_local_delta(e0, d1) >= d0:
                break
        lo = d1 / 10
        for _ in range(200):
            mid = math.sqrt(lo * d1)
            if cb.max_local_delta(e0, mid) >= d0:
                d1 = mid
            else:
                lo = mid
        if delta * (1 - 1e-9) + m * (math.exp(eps) + 1) * d1 <= target * (1 + 1e-9):
            certified = True
            break
    assert certified
    # more noise, more check-in sparsity or more steps: a smaller ε'
    assert (
        cb.gaussian_fixed_window_epsilon(
            target, noise_multiplier=2 * sigma, checkin_probability=p0, steps=m
        )
        < eps
    )
    assert cb.gaussian_fixed_window_epsilon(
        target, noise_multiplier=sigma, checkin_probability=p0 / 2, steps=m
    ) == pytest.approx(eps / 2, rel=0.02)


def test_gaussian_reading_gives_no_guarantee_at_the_papers_sigma():
    # Hasircioglu & Gunduz's Figure 4 setting: σ = 3, C = 1, p0 = 0.1. ε0 <= 1
    # leaves δ0(1) ≈ 2.1e-4 (sensitivity C; ≈ 3.1e-2 at 2C), which the δ0
    # condition admits only for δ1 > 0.4, so δ' >= 2 δ1 > 0.8: the theorem
    # certifies nothing below δ' = 1/2.
    for sens in (1.0, 2.0):
        for target in (1e-8, 1e-5, 1e-2, 0.5):
            assert math.isinf(
                cb.gaussian_fixed_window_epsilon(
                    target,
                    noise_multiplier=3.0,
                    checkin_probability=0.1,
                    steps=1,
                    sensitivity=sens,
                )
            )
    assert gaussian.delta_for_epsilon(1.0, noise_multiplier=3.0) == pytest.approx(
        2.1e-4, rel=0.05
    )
    assert cb.max_local_delta(1.0, 0.4) < 2.0e-4


def test_analysis_status_is_proven_for_its_own_protocol():
    assert cb.ANALYSIS.status == "proven"
    assert "Theorem 3.2" in cb.ANALYSIS.basis
    assert (
        cb.ANALYSIS.neighbouring is not None and "replace" in cb.ANALYSIS.neighbouring
    )
