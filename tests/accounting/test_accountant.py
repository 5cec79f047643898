"""The Accountant against dp_accounting on the events that reduce to standard ones."""

import logging

import numpy as np
import pytest
from dp_accounting.pld import privacy_loss_distribution as pld_lib

from dpfl.accounting.accountant import Accountant
from dpfl.accounting.events import (
    ClientPoisson,
    FixedCohort,
    Gaussian,
    PoissonSampled,
    RecordPoisson,
    SelfComposed,
    WithoutReplacement,
)
from dpfl.errors import InvalidParameterError, UnsupportedEventError


def reference_epsilon(sigma, rate, count, delta):
    """dp_accounting's own pessimistic PLD, fine grid (independent code path)."""
    logging.disable(logging.WARNING)
    try:
        pld = pld_lib.from_gaussian_mechanism(
            sigma, sampling_prob=rate, value_discretization_interval=1e-5
        )
        return pld.self_compose(count).get_epsilon_for_delta(delta)
    finally:
        logging.disable(logging.NOTSET)


def random_cases(n=20, seed=20261121):
    rng = np.random.default_rng(seed)
    for _ in range(n):
        sigma = float(rng.uniform(0.6, 4.0))
        rate = float(10 ** rng.uniform(-3, 0))
        count = int(rng.integers(1, 400))
        delta = float(10 ** rng.uniform(-8, -3))
        yield sigma, rate, count, delta


# The cases composing fewer than 20 rounds run by default (their cost grows
# with the count); the others with -m slow (.ci/run runs both).
@pytest.mark.parametrize(
    "sigma, rate, count, delta",
    [
        c if c[2] < 20 else pytest.param(*c, marks=pytest.mark.slow)
        for c in random_cases()
    ],
)
def test_poisson_gaussian_matches_dp_accounting(sigma, rate, count, delta):
    # Tolerance 0.5% relative (issue acceptance), against dp_accounting's PLD.
    ref = reference_epsilon(sigma, rate, count, delta)
    event = PoissonSampled(rate, Gaussian(sigma))
    bound = Accountant().compose(event, count).epsilon(delta)
    assert bound.upper == pytest.approx(ref, rel=5e-3, abs=1e-6)
    assert bound.lower <= ref * (1 + 1e-6) + 1e-9
    # The same scheme spelled as client or record sampling prices the same.
    for same in (
        ClientPoisson(rate, Gaussian(sigma)),
        RecordPoisson(rate, 30, Gaussian(sigma)),
    ):
        assert Accountant().compose(same, count).epsilon(delta).upper == pytest.approx(
            bound.upper, rel=1e-9
        )


@pytest.mark.parametrize("sigma, count", [(0.8, 1), (1.0, 4), (3.0, 100)])
def test_plain_gaussian_matches_closed_form(sigma, count):
    # T compositions of a Gaussian are mu-GDP with mu = sqrt(T)/sigma (exact);
    # delta(eps) closed form (Balle-Wang 2018 Thm 8), tolerance 0.5%.
    from scipy.stats import norm

    mu = np.sqrt(count) / sigma
    eps = 1.0
    exact = norm.cdf(-eps / mu + mu / 2) - np.exp(eps) * norm.cdf(-eps / mu - mu / 2)
    b = Accountant().compose(Gaussian(sigma), count).delta(eps)
    assert b.lower <= exact * (1 + 1e-9) and exact <= b.upper * (1 + 1e-9)
    assert b.upper == pytest.approx(exact, rel=5e-3)


def test_self_composed_equals_count():
    e = PoissonSampled(0.1, Gaussian(1.5))
    a = Accountant().compose(SelfComposed(e, 10), 3).epsilon(1e-5).upper
    b = Accountant().compose(e, 30).epsilon(1e-5).upper
    assert a == pytest.approx(b, rel=1e-6)


def test_errors():
    with pytest.raises(InvalidParameterError, match="delta"):
        Accountant().compose(Gaussian(1.0)).epsilon(1.5)
    with pytest.raises(InvalidParameterError, match="event"):
        Accountant().compose("gaussian")

    class Strange(Gaussian.__mro__[1]):  # a bare Event subclass nobody prices
        pass

    with pytest.raises(UnsupportedEventError, match="Strange"):
        Accountant().compose(Strange()).epsilon(1e-5)


def test_composed_epsilon_is_the_accountants_answer_kept_for_the_process():
    # The ledger, its guard and calibration ask through composed_epsilon; the
    # answer must be the Accountant's own, and a repeated question (another
    # seed of the same run, another ledger) must not be computed again.
    from dpfl.accounting.accountant import composed_epsilon

    events = ((ClientPoisson(0.3, Gaussian(1.7)), 3), (Gaussian(9.0), 1))
    direct = Accountant("sound", tolerance=0.02)
    for e, n in events:
        direct.compose(e, n)
    composed_epsilon.cache_clear()
    first = composed_epsilon(events, 1e-5, analysis="sound", tolerance=0.02)
    assert first == direct.epsilon(1e-5)
    again = composed_epsilon(events, 1e-5, analysis="sound", tolerance=0.02)
    assert again == first
    info = composed_epsilon.cache_info()
    assert (info.hits, info.misses) == (1, 1)
    # another δ, tolerance or analysis is another question
    composed_epsilon(events, 1e-6, analysis="sound", tolerance=0.02)
    composed_epsilon(events, 1e-5, analysis="sound", tolerance=0.005)
    assert composed_epsilon.cache_info().misses == 3


@pytest.mark.parametrize(
    "event, count",
    [
        (FixedCohort(50, 1000, Gaussian(1.0)), 30),  # the peer task's rounds
        (FixedCohort(20, 100, Gaussian(3.0)), 300),  # losses finer than 4e-2
        (FixedCohort(100, 10_000, Gaussian(1.0)), 1000),  # finer than 1e-2
        (FixedCohort(100, 10_000, Gaussian(3.0)), 300),  # starts on its own scale
        (WithoutReplacement(256, 1000, Gaussian(0.7)), 100),
    ],
)
def test_a_runs_tolerance_starts_coarser_and_stays_within_it(event, count):
    # A ledger asks at tolerance 0.02, where the symmetrised subsampling PLDs
    # start on a grid up to 4x coarser than at 0.005, or on one round's own
    # loss scale when that is finer than 5e-3 (accountant._start_grid).
    # Reference: the same analysis on a 4e-3 grid (its own bracket about 1e-4
    # wide). Both brackets are certified, so each must reach the other's
    # (1e-9 relative for the reading's rounding), and the coarse one must be
    # within the tolerance of the fine upper value.
    coarse = Accountant(tolerance=0.02).compose(event, count).epsilon(1e-5)
    fine = (
        Accountant(tolerance=1e-3, discretization=4e-3)
        .compose(event, count)
        .epsilon(1e-5)
    )
    assert fine.gap < 2e-3
    assert coarse.lower <= fine.upper * (1 + 1e-9)
    assert fine.lower <= coarse.upper * (1 + 1e-9)
    assert coarse.gap <= 0.02
    assert coarse.upper <= fine.upper * 1.02
