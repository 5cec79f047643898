"""Samplers: laws, independence, cost, and a contract shared by every sampler.

Statistical tests use fixed seeds and a stated false-alarm rate: with a fixed
seed a test either always passes or always fails, and the rate says how
unlikely a failure would be if the sampler were correct.
"""

import itertools
import math
import tracemalloc

import numpy as np
import pytest
from scipy import stats

from dpfl.accounting import events as ev
from dpfl.errors import InvalidParameterError
from dpfl.sim.sampling import (
    FixedCohortSampler,
    PoissonClientSampler,
    PoissonParticipationSampler,
    RoundSample,
)

ALPHA = 1e-4  # false-alarm rate of every statistical test in this file


def _contiguous_indices(sizes):
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    # Reverse the row order inside each client so global rows != positions.
    return [
        np.arange(s + n - 1, s - 1, -1, dtype=np.int64) for s, n in zip(starts, sizes)
    ]


SIZES = np.array([3, 0, 7, 12, 1, 5, 9, 4, 6, 2] * 3, dtype=np.int64)
INDICES = _contiguous_indices(SIZES)

SAMPLERS = {
    "participation": lambda: PoissonParticipationSampler(
        num_clients=len(SIZES),
        participation_probability=0.4,
        record_probability=0.3,
        client_sizes=SIZES,
        client_indices=INDICES,
    ),
    "fixed-cohort": lambda: FixedCohortSampler(
        num_clients=len(SIZES),
        cohort_size=7,
        client_sizes=SIZES,
        client_indices=INDICES,
    ),
    "poisson-client": lambda: PoissonClientSampler(
        num_clients=len(SIZES),
        participation_probability=0.4,
        client_sizes=SIZES,
        client_indices=INDICES,
    ),
    "poisson-client-batch": lambda: PoissonClientSampler(
        num_clients=len(SIZES),
        participation_probability=0.4,
        client_sizes=SIZES,
        batch_size=3,
        client_indices=INDICES,
    ),
}


# ------------------------------------------------------------------ contract suite
@pytest.mark.parametrize("name", sorted(SAMPLERS))
def test_sampler_contract(name):
    sampler = SAMPLERS[name]()
    for seed in range(50):
        s = sampler.sample(np.random.default_rng(seed))
        again = sampler.sample(np.random.default_rng(seed))
        # Deterministic given the generator.
        assert np.array_equal(s.clients, again.clients)
        assert np.array_equal(s.records, again.records)
        # Clients: int64, distinct, ascending, in range.
        assert s.clients.dtype == np.int64
        assert np.all(np.diff(s.clients) > 0)
        assert s.clients.size == 0 or 0 <= s.clients[0] <= s.clients[-1] < len(SIZES)
        # CSR layout.
        assert s.record_offsets.dtype == np.int64
        assert s.record_offsets.shape == (s.num_clients + 1,)
        assert s.record_offsets[0] == 0 and s.record_offsets[-1] == s.num_records
        assert np.all(s.counts() >= 0)
        assert s.segment_ids().shape == (s.num_records,)
        for j, k in enumerate(s.clients):
            pos = s.positions[s.record_offsets[j] : s.record_offsets[j + 1]]
            assert np.all(np.diff(pos) > 0)  # distinct, ascending
            assert pos.size == 0 or (pos[0] >= 0 and pos[-1] < SIZES[k])
            # records are the global rows of those positions
            assert np.array_equal(s.client_records(j), INDICES[k][pos])
        # resolve() from positions alone gives the same global rows
        bare = RoundSample(s.clients, s.record_offsets, None, s.positions)
        assert np.array_equal(bare.resolve(INDICES).records, s.records)
    assert isinstance(sampler.event(1.5), ev.Event)


def test_events_realised():
    p = SAMPLERS["participation"]()
    assert p.event(2.0) == ev.ClientPoisson(
        0.4, ev.RecordPoisson(0.3, int(SIZES.max()), ev.Gaussian(2.0))
    )
    assert SAMPLERS["fixed-cohort"]().event(1.0) == ev.FixedCohort(
        7, len(SIZES), ev.Gaussian(1.0)
    )
    assert SAMPLERS["poisson-client"]().event(1.0) == ev.ClientPoisson(
        0.4, ev.Gaussian(1.0)
    )


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(participation_probability=0.0), "participation_probability"),
        (dict(participation_probability=1.5), "participation_probability"),
        (dict(record_probability=-0.1), "record_probability"),
        (dict(num_clients=0), "num_clients"),
        (dict(client_sizes=np.array([1, 2])), "client_sizes"),
        (dict(client_sizes=np.array([1.0, 2.0, 3.0])), "client_sizes"),
        (dict(client_sizes=np.array([1, -2, 3])), "client_sizes"),
    ],
)
def test_participation_sampler_rejects_bad_input(kwargs, match):
    base = dict(
        num_clients=3,
        participation_probability=0.5,
        record_probability=0.5,
        client_sizes=np.array([1, 2, 3]),
    )
    base.update(kwargs)
    with pytest.raises(InvalidParameterError, match=match):
        PoissonParticipationSampler(**base)


def test_sample_rejects_non_generator():
    with pytest.raises(InvalidParameterError, match="rng"):
        SAMPLERS["participation"]().sample(np.random.RandomState(0))


# ------------------------------------------------------------------------ the laws
def test_participation_and_record_rates_match_p_and_q():
    # Over R rounds the number of participations is exactly Binomial(N R, p)
    # (independent coins), and given the participants the number of sampled
    # records is Binomial(sum of their sizes, q). Two-sided exact binomial
    # tests, false-alarm rate ALPHA each.
    n, p, q, d, rounds = 2_000, 0.05, 0.3, 20, 300
    s = PoissonParticipationSampler(
        num_clients=n,
        participation_probability=p,
        record_probability=q,
        client_sizes=np.full(n, d),
    )
    rng = np.random.default_rng(12345)
    joined = records = 0
    for _ in range(rounds):
        r = s.sample(rng)
        joined += r.num_clients
        records += r.num_records
    assert stats.binomtest(joined, n * rounds, p).pvalue > ALPHA
    assert stats.binomtest(records, joined * d, q).pvalue > ALPHA


def test_joint_law_of_small_population_is_independent_bernoulli():
    # N = 6 clients: the 64 participation patterns must have probabilities
    # p^k (1-p)^(6-k). Chi-square goodness of fit over the 64 cells
    # (R = 40,000 rounds, smallest expected count 40000 * 0.3^6 = 29),
    # false-alarm rate ALPHA. This checks the marginals *and* independence.
    n, p, rounds = 6, 0.3, 40_000
    s = PoissonParticipationSampler(
        num_clients=n,
        participation_probability=p,
        record_probability=1.0,
        client_sizes=np.ones(n, dtype=np.int64),
    )
    rng = np.random.default_rng(7)
    counts = np.zeros(2**n)
    weights = 1 << np.arange(n)
    for _ in range(rounds):
        counts[int(weights[s.sample(rng).clients].sum())] += 1
    k = np.array([bin(c).count("1") for c in range(2**n)])
    expected = rounds * p**k * (1 - p) ** (n - k)
    assert stats.chisquare(counts, expected).pvalue > ALPHA


def test_joint_law_of_records_within_a_client():
    # One client with d = 4 records, p = 1: the 16 record patterns must have
    # probabilities q^k (1-q)^(4-k). Chi-square, false-alarm rate ALPHA.
    d, q, rounds = 4, 0.35, 20_000
    s = PoissonParticipationSampler(
        num_clients=1,
        participation_probability=1.0,
        record_probability=q,
        client_sizes=np.array([d]),
    )
    rng = np.random.default_rng(3)
    counts = np.zeros(2**d)
    weights = 1 << np.arange(d)
    for _ in range(rounds):
        counts[int(weights[s.sample(rng).positions].sum())] += 1
    k = np.array([bin(c).count("1") for c in range(2**d)])
    assert stats.chisquare(counts, rounds * q**k * (1 - q) ** (d - k)).pvalue > ALPHA


def test_large_population_uniform_and_pairwise_independent():
    # N = 100,000, p = 0.001: numpy's Floyd path (M <= N/50). (a) Client
    # counts summed over 100 blocks of 1,000 clients are uniform: chi-square,
    # false-alarm rate ALPHA. (b) Adjacent pairs (k, k+1) both joining: the
    # count has mean (N-1) R p^2 = 200 and variance 200 (1 - p^2) + 2 (N-2) R
    # (p^3 - p^4) ≈ 200.4 if coins are independent; normal test at two-sided
    # rate ALPHA (z = 3.89).
    n, p, rounds = 100_000, 0.001, 2_000
    s = PoissonParticipationSampler(
        num_clients=n,
        participation_probability=p,
        record_probability=1.0,
        client_sizes=np.ones(n, dtype=np.int64),
    )
    rng = np.random.default_rng(11)
    blocks = np.zeros(100)
    pairs = 0
    for _ in range(rounds):
        c = s.sample(rng).clients
        blocks += np.bincount(c // 1_000, minlength=100)
        pairs += int(np.sum(np.diff(c) == 1))
    total = blocks.sum()
    assert stats.binomtest(int(total), n * rounds, p).pvalue > ALPHA
    assert stats.chisquare(blocks).pvalue > ALPHA
    mean = (n - 1) * rounds * p**2
    var = mean * (1 - p**2) + 2 * (n - 2) * rounds * (p**3 - p**4)
    assert abs(pairs - mean) / math.sqrt(var) < stats.norm.isf(ALPHA / 2)


def test_billion_clients_cost_grows_with_participants_only():
    # N = 10^9 clients described by a zero-stride sizes array (8 bytes). A round
    # at p = 10^-6 must allocate O(participants): an O(N) step would need
    # >= 1 GB (a bool per client) or 8 GB (an int64 per client); we allow 5 MB.
    n = 10**9
    sizes = np.broadcast_to(np.int64(30), (n,))
    s = PoissonParticipationSampler(
        num_clients=n,
        participation_probability=1e-6,
        record_probability=0.1,
        client_sizes=sizes,
    )
    rng = np.random.default_rng(0)
    tracemalloc.start()
    try:
        r = s.sample(rng)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 5 * 2**20
    # ~1,000 participants expected; Binomial(1e9, 1e-6) lies in [850, 1150]
    # except with probability < 1e-5.
    assert 850 <= r.num_clients <= 1150
    assert r.clients[-1] < n and np.all(np.diff(r.clients) > 0)
    assert r.records is None  # no dataset index table was given
    assert np.all(r.positions < 30)


def test_fixed_cohort_is_uniform_over_subsets():
    # K = 10, m = 3: each of the C(10, 3) = 120 cohorts has probability 1/120.
    # Chi-square over the 120 cells (R = 24,000, 200 expected each),
    # false-alarm rate ALPHA.
    k, m, rounds = 10, 3, 24_000
    s = FixedCohortSampler(num_clients=k, cohort_size=m, client_sizes=np.ones(k, int))
    index = {c: i for i, c in enumerate(itertools.combinations(range(k), m))}
    rng = np.random.default_rng(5)
    counts = np.zeros(len(index))
    for _ in range(rounds):
        r = s.sample(rng)
        assert r.num_clients == m and r.num_records == m
        counts[index[tuple(r.clients.tolist())]] += 1
    assert stats.chisquare(counts).pvalue > ALPHA


def test_poisson_client_sampler_rate_and_batch():
    # Participations ~ Binomial(N R, p), exact two-sided test at ALPHA; the
    # mini-batch has min(batch_size, n_k) distinct records.
    n, p, rounds = 500, 0.1, 400
    sizes = np.arange(1, n + 1) % 9
    s = PoissonClientSampler(
        num_clients=n, participation_probability=p, client_sizes=sizes, batch_size=4
    )
    rng = np.random.default_rng(2)
    joined = 0
    for _ in range(rounds):
        r = s.sample(rng)
        joined += r.num_clients
        assert np.array_equal(r.counts(), np.minimum(sizes[r.clients], 4))
    assert stats.binomtest(joined, n * rounds, p).pvalue > ALPHA


def test_fixed_cohort_rejects_cohort_larger_than_population():
    with pytest.raises(InvalidParameterError, match="cohort_size"):
        FixedCohortSampler(num_clients=3, cohort_size=4, client_sizes=np.ones(3, int))
