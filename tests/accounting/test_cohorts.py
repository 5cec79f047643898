"""Fixed-size cohorts with Poisson records: event, analysis, sampler and preset.

The proven analysis (``wcs``, :mod:`dpfl.accounting.cohorts`) is checked
against an independent computation with dp_accounting: with the cohort
revealed, the round's label "the record's client is in the cohort" is public
and Bernoulli(m/K), i.i.d. over rounds, so delta(eps) of T rounds is exactly
``sum_n Binomial(T, m/K)(n) * delta_n(eps)``, where delta_n is the n-fold
composition of the Poisson(q)-subsampled Gaussian (a hockey-stick divergence
of a public-label mixture is the mixture of the labels' divergences).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from dp_accounting import dp_event
from dp_accounting.pld import pld_privacy_accountant
from dp_accounting.pld import privacy_loss_distribution as pld_lib
from scipy import stats

from dpfl.accounting import Accountant, CohortRecordPoisson, Gaussian, describe
from dpfl.accounting.events import event_from_dict, event_to_dict
from dpfl.errors import InvalidParameterError
from dpfl.experiments.presets import PRESET_DIR

M, K, Q, D, SIGMA = 10, 100, 0.5, 5, 1.0
EVENT = CohortRecordPoisson(M, K, Q, D, Gaussian(SIGMA))


def test_the_scheme_states_its_terms_and_its_proven_default():
    terms = describe(EVENT)
    assert terms["scheme"] == "fixed-size cohorts with Poisson records"
    assert terms["unit"] == "record"
    assert (terms["analysis"], terms["status"]) == ("wcs", "proven")
    assert "cohort" in terms["adversary"]
    assert describe(EVENT, "cs")["status"] == "invalid"
    assert event_from_dict(event_to_dict(EVENT)) == EVENT
    assert Accountant.supports(EVENT)
    with pytest.raises(InvalidParameterError, match="cohort_size must be <="):
        CohortRecordPoisson(11, 10, Q, D, Gaussian(SIGMA))


def test_wcs_matches_a_binomial_mixture_of_dp_accounting_plds():
    # Reference: dp_accounting's connect-the-dots PLD of the Poisson-subsampled
    # Gaussian (pessimistic, so at or above the truth), n-fold composed and
    # mixed over n ~ Binomial(T, m/K). Tolerance: the reference's own
    # discretisation (interval 1e-4) is well under 1% here; dpfl's bracket
    # must hold it: lower <= reference <= upper * 1.01.
    rounds, eps = 20, 2.0
    one = pld_lib.from_gaussian_mechanism(
        SIGMA, sampling_prob=Q, value_discretization_interval=1e-4
    )
    weights = stats.binom.pmf(np.arange(rounds + 1), rounds, M / K)
    reference, composed = 0.0, None
    for n in range(1, rounds + 1):
        composed = one if composed is None else composed.compose(one)
        if weights[n] < 1e-18:
            break
        reference += weights[n] * composed.get_delta_for_epsilon(eps)
    bound = Accountant().compose(EVENT, rounds).delta(eps)
    assert bound.lower <= reference * (1 + 1e-3)
    assert reference <= bound.upper * 1.01
    assert bound.upper <= reference * 1.05  # and not loose


def test_cs_reading_is_dp_accountings_poisson_sampled_gaussian_at_m_q_over_k():
    # The invalid reading, priced as the record Poisson-sampled at rate m q / K:
    # dp_accounting's PLD accountant on PoissonSampledDpEvent(m q / K,
    # Gaussian(sigma)) gives the same epsilon within 1% (both are certified
    # upper values of the same pair; dpfl's bracket is at 0.5%).
    rounds, delta = 50, 1e-5
    ref = pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-4)
    ref.compose(
        dp_event.PoissonSampledDpEvent(M * Q / K, dp_event.GaussianDpEvent(SIGMA)),
        rounds,
    )
    expected = ref.get_epsilon(delta)
    got = Accountant("cs").compose(EVENT, rounds).epsilon(delta)
    assert got.lower <= expected * 1.01 and expected <= got.upper * 1.01
    # The proven figure is larger: the cohort is not hidden by it.
    assert Accountant().compose(EVENT, rounds).epsilon(delta).lower > got.upper


def test_sampler_draws_m_distinct_clients_and_records_at_rate_q():
    from dpfl.sim.sampling import CohortRecordSampler

    sampler = CohortRecordSampler(
        num_clients=K,
        cohort_size=M,
        record_probability=Q,
        client_sizes=np.full(K, D),
    )
    assert sampler.event(SIGMA) == EVENT
    rng = np.random.default_rng(0)
    rounds, hits = 4000, 0
    for _ in range(rounds):
        s = sampler.sample(rng)
        assert len(np.unique(s.clients)) == len(s.clients) == M
        j = np.searchsorted(s.clients, 0)
        if j < M and s.clients[j] == 0:
            hits += int(0 in s.positions[s.record_offsets[j] : s.record_offsets[j + 1]])
    # record 0 of client 0 is in a round w.p. m q / K = 0.05; 5 standard errors
    rate = M * Q / K
    assert abs(hits / rounds - rate) < 5 * math.sqrt(rate * (1 - rate) / rounds)


def test_dsgd_rp_with_a_cohort_runs_the_preset_and_charges_the_event(tmp_path):
    from dpfl.experiments.config import load_config
    from dpfl.experiments.runner import run
    from dpfl.sim.algorithms.dsgd_rp import DsgdRpParams

    with pytest.raises(InvalidParameterError, match="participation_probability"):
        DsgdRpParams(cohort_size=5, participation_probability=0.3)
    with pytest.raises(InvalidParameterError, match="availability 'all'"):
        DsgdRpParams(cohort_size=5, availability="bernoulli", availability_rate=0.5)
    config = load_config(
        PRESET_DIR / "digits-dsgd-rp-cohort.yaml",
        [
            f"output_dir={tmp_path}",
            "rounds=2",
            "eval_every=1",
            "privacy.noise_multiplier=2.779",  # the calibrated value (header)
        ],
    )
    result = run(config, progress=False)
    assert result.rounds_completed == 2
    import json

    ledger = json.loads((config.run_dir / "ledger.json").read_text())
    event = event_from_dict(ledger["entries"][0]["event"])
    assert isinstance(event, CohortRecordPoisson)
    assert (event.cohort_size, event.population) == (52, 260)
    assert ledger["summary"]["analysis"] == "wcs"
