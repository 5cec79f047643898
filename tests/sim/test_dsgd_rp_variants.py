"""DP-DSGD with random participation: client availability (N_t <= N) and the
participants-only untrusted server (Hasircioglu & Gündüz, arXiv 2205.01556,
§3 and §5.5).
"""

import math

import numpy as np
import pytest
import torch
from scipy import stats
from torch import nn

from dpfl.accounting import events as ev
from dpfl.accounting.ledger import PrivacyLedger
from dpfl.data import FederatedDataset, get_dataset
from dpfl.errors import InvalidParameterError
from dpfl.experiments.presets import PRESET_DIR
from dpfl.models import build_model
from dpfl.sim.algorithms import build_algorithm, make_params
from dpfl.sim.algorithms.base import DataStats
from dpfl.sim.algorithms.dsgd_rp import DsgdRandomParticipation
from dpfl.sim.availability import ClientAvailability
from dpfl.sim.grad import clipped_grad_sum
from dpfl.sim.loop import Trainer
from dpfl.sim.plan import plan_privacy
from dpfl.sim.privatize import ClientGaussian
from dpfl.sim.randomness import Streams, client_streams, server_streams
from dpfl.sim.sampling import PoissonParticipationSampler

PARAMS = dict(
    participation_probability=0.5,
    record_probability=0.5,
    clip=1.0,
    learning_rate=0.5,
    momentum=0.9,
)


def _digits(num_clients=50):
    return get_dataset("digits", num_clients=num_clients, seed=0, flatten=True)


def _build(ds, sigma=1.0, model=None, **kw):
    if model is None:
        torch.manual_seed(0)
        model = build_model(
            "mlp", input_shape=ds.input_shape, num_classes=ds.num_classes
        )
    return build_algorithm(
        "dsgd-rp", {**PARAMS, **kw}, model=model, dataset=ds, noise_multiplier=sigma
    )


def _estimate(alg, seed=0, round_index=0, server=None):
    server = server_streams(seed, round_index) if server is None else server
    cohort = alg.select(round_index, server)
    streams = [client_streams(seed, round_index, t.client) for t in cohort.tasks]
    messages = alg.client_steps(alg.weights, cohort.tasks, streams)
    return alg.estimate(cohort, messages)[0], cohort


def _tiny_dataset(sizes, seed=0):
    n = int(sum(sizes))
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 3)).astype(np.float32)
    y = (rng.random(n) < 0.5).astype(np.int64)
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    idx = [np.arange(s, s + k, dtype=np.int64) for s, k in zip(starts, sizes)]
    return FederatedDataset(
        features=x,
        labels=y,
        client_indices=idx,
        num_classes=2,
        test_features=x,
        test_labels=y,
    )


# ------------------------------------------------------------------ availability
def test_availability_parameters_are_validated():
    with pytest.raises(InvalidParameterError, match="availability must be one of"):
        make_params("dsgd-rp", {**PARAMS, "availability": "sometimes"})
    with pytest.raises(InvalidParameterError, match="availability_rate"):
        make_params("dsgd-rp", {**PARAMS, "availability_rate": 0.5})
    with pytest.raises(InvalidParameterError, match="availability_rate"):
        make_params(
            "dsgd-rp", {**PARAMS, "availability": "bernoulli", "availability_rate": 0}
        )
    with pytest.raises(InvalidParameterError, match="available_clients"):
        make_params("dsgd-rp", {**PARAMS, "availability": "fixed"})
    with pytest.raises(InvalidParameterError, match="available_clients"):
        make_params("dsgd-rp", {**PARAMS, "available_clients": 3})
    ds = _digits(20)
    with pytest.raises(InvalidParameterError, match="available_clients must be <="):
        _build(ds, availability="fixed", available_clients=21)
    with pytest.raises(InvalidParameterError, match="secure_aggregation"):
        make_params(
            "dsgd-rp",
            {**PARAMS, "server": "untrusted-participants", "secure_aggregation": True},
        )


def test_availability_draws_are_seeded_and_never_see_the_data():
    # The online set is a function of the generator alone (the class is never
    # given data): the same seed gives the same set, whatever the data.
    fixed = ClientAvailability(num_clients=40, model="fixed", available_clients=7)
    a = fixed.draw(np.random.default_rng(5))
    assert len(a) == 7 and np.all(np.diff(a) > 0) and a[0] >= 0 and a[-1] < 40
    assert np.array_equal(a, fixed.draw(np.random.default_rng(5)))
    # Bernoulli(0.3) over N = 40: N_t ~ Binomial(40, 0.3); over 2,000 draws the
    # mean of N_t is 12 +- 4.42 * sqrt(40 * 0.3 * 0.7 / 2000) (two-sided 1e-5).
    bern = ClientAvailability(num_clients=40, model="bernoulli", rate=0.3)
    rng = np.random.default_rng(0)
    counts = [len(bern.draw(rng)) for _ in range(2_000)]
    assert abs(np.mean(counts) - 12.0) < 4.42 * math.sqrt(40 * 0.21 / 2_000)
    everyone = ClientAvailability(num_clients=5)
    assert np.array_equal(everyone.draw(np.random.default_rng(0)), np.arange(5))
    # Two data sets with the same population but different records: the
    # algorithms draw the same online sets and the same participants.
    one = _build(
        _tiny_dataset([4] * 8, seed=0),
        model=nn.Linear(3, 2),
        availability="fixed",
        available_clients=3,
    )
    two = _build(
        _tiny_dataset([4] * 8, seed=1),
        model=nn.Linear(3, 2),
        availability="fixed",
        available_clients=3,
    )
    for r in range(5):
        c1 = one.select(r, server_streams(0, r)).info
        c2 = two.select(r, server_streams(0, r)).info
        assert np.array_equal(c1["online"], c2["online"])


def test_sample_available_generalises_sample():
    sizes = np.array([3, 5, 2, 8, 1, 4], dtype=np.int64)
    sampler = PoissonParticipationSampler(
        num_clients=6,
        participation_probability=0.6,
        record_probability=0.5,
        client_sizes=sizes,
    )
    for seed in range(20):
        full = sampler.sample(np.random.default_rng(seed))
        same = sampler.sample_available(np.random.default_rng(seed), np.arange(6))
        assert np.array_equal(full.clients, same.clients)
        assert np.array_equal(full.positions, same.positions)
        online = np.array([1, 3, 4])
        part = sampler.sample_available(np.random.default_rng(seed), online)
        assert set(part.clients.tolist()) <= set(online.tolist())
    with pytest.raises(InvalidParameterError, match="available"):
        sampler.sample_available(np.random.default_rng(0), np.array([3, 1]))
    with pytest.raises(InvalidParameterError, match="available"):
        sampler.sample_available(np.random.default_rng(0), np.array([6]))


def _clipped_client_sums(alg, ds, clip):
    """Each client's exact Σ clip_C(∇ℓ) over all its records, flat."""
    out = []
    for rows in ds.client_indices:
        x, y = (torch.as_tensor(a) for a in ds.take(rows))
        out.append(alg.flatten(clipped_grad_sum(alg.model, None, x, y, clip=clip)))
    return torch.stack(out).double()


@pytest.mark.parametrize(
    "model,extra",
    [("fixed", {"available_clients": 3}), ("bernoulli", {"availability_rate": 0.6})],
)
def test_scaling_with_availability_is_unbiased_monte_carlo(model, extra):
    # Noise off, clip binding (C = 0.3), unequal sizes. Given the online set A,
    # E[ĝ | A] = Σ_{k∈A} S_k / Σ_{k∈A} n_k (S_k: client k's exact clipped sum),
    # the paper's 1/(p N_t q d) with equal sizes. R = 1,000 rounds; per
    # coordinate |mean(ĝ - target(A))| < z·se with z = 4.42 (two-sided 1e-5,
    # 8 coordinates: family-wise < 1e-4). Power: scaling by all n records
    # instead of the online ones shrinks ĝ by about N_t/N (3/8 or 0.6).
    sizes = [2, 5, 7, 3, 4, 1, 6, 2]
    ds = _tiny_dataset(sizes)
    torch.manual_seed(0)
    alg = build_algorithm(
        "dsgd-rp",
        dict(
            participation_probability=0.5,
            record_probability=0.4,
            clip=0.3,
            availability=model,
            **extra,
        ),
        model=nn.Linear(3, 2),
        dataset=ds,
    )
    sums = _clipped_client_sums(alg, ds, 0.3)
    n = torch.tensor(sizes, dtype=torch.float64)
    diffs, nts = [], []
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for r in range(1_000):
            server = Streams(np.random.default_rng(r), torch.Generator())
            g, cohort = _estimate(alg, server=server)
            online = torch.as_tensor(cohort.info["online"])
            nts.append(len(online))
            if len(online) == 0:  # nothing online: ĝ = 0, nothing to estimate
                assert torch.count_nonzero(g) == 0
                continue
            target = sums[online].sum(0) / n[online].sum()
            diffs.append(g.double() - target)
    finally:
        torch.set_num_threads(threads)
    d = torch.stack(diffs)
    se = d.std(0) / math.sqrt(d.shape[0])
    assert torch.all(d.mean(0).abs() < 4.42 * se)
    if model == "fixed":
        assert set(nts) == {3}
    else:
        assert 0 < np.mean(nts) < 8


def test_availability_leaves_the_event_unchanged_and_every_round_is_charged():
    # The event depends on p, q, d and σ only: an always-online client faces
    # it every round, so charging it every round covers every client. A round
    # with no client online (Bernoulli, rate 0.05 over 5 clients: P(N_t = 0)
    # = 0.77) updates nothing and is still charged.
    ds = _tiny_dataset([3, 5, 2, 4, 1])
    base = _build(ds, sigma=2.0, model=nn.Linear(3, 2))
    rare = _build(
        ds,
        sigma=2.0,
        model=nn.Linear(3, 2),
        availability="bernoulli",
        availability_rate=0.05,
    )
    event = ev.ClientPoisson(0.5, ev.RecordPoisson(0.5, 5, ev.Gaussian(2.0)))
    assert base.event() == rare.event() == event
    stats_ = DataStats.of(ds)
    assert DsgdRandomParticipation.round_event(rare.params, stats_, 2.0) == event
    ledger = PrivacyLedger()
    reports = Trainer(rare, ledger=ledger, seed=0).run(12)
    assert ledger.rounds == 12 and all(r.event == event for r in reports)
    empty = [r for r in reports if r.metrics["available"] == 0]
    assert empty and all(r.metrics["update_norm"] == 0 for r in empty)


def test_untrusted_noise_only_messages_count_the_online_clients():
    # Every online client sends (§5.5): with per-message noise σC the sum's
    # noise is sqrt(N_t) σC (N_t = 10 of 50 online), not sqrt(N) σC.
    ds = _digits(50)
    kw = dict(availability="fixed", available_clients=10)
    trusted = _estimate(_build(ds, **kw), seed=3)[0]
    local = _estimate(_build(ds, server="untrusted", **kw), seed=3)[0]
    free = _estimate(_build(ds, sigma=0.0, **kw), seed=3)[0]
    torch.testing.assert_close(
        local - free, math.sqrt(10) * (trusted - free), rtol=1e-4, atol=1e-6
    )


# ------------------------------------------------- participants-only untrusted
def test_participants_only_messages_carry_their_own_noise():
    # Same seed => same participants, records and standard normal draw. Each
    # of the m participants adds N(0, σ²C²), so the sum carries sqrt(m) σC:
    # ĝ_part - ĝ_free = sqrt(m) (ĝ_trusted - ĝ_free) up to float32 rounding.
    ds = _digits(50)
    part = _build(ds, sigma=1.5, clip=0.7, server="untrusted-participants")
    assert isinstance(part.privatizer, ClientGaussian)
    assert part.privatizer.message_std() == pytest.approx(1.5 * 0.7, rel=1e-15)
    assert part.messages_are_releases
    g_part, cohort = _estimate(part, seed=3)
    m = len(cohort.participants)
    assert 10 < m < 40
    trusted = _estimate(_build(ds, sigma=1.5, clip=0.7), seed=3)[0]
    free = _estimate(_build(ds, sigma=0.0, clip=0.7), seed=3)[0]
    torch.testing.assert_close(
        g_part - free, math.sqrt(m) * (trusted - free), rtol=1e-4, atol=1e-6
    )
    # Nobody took part: nothing is sent, so no noise at all.
    assert (
        ClientGaussian(noise_multiplier=1.5, clip=0.7).noise_std(
            num_participants=0, num_available=50
        )
        == 0.0
    )


def _wcs_delta(eps, p, q, sigma):
    """Theorem 5.2 of Hasircioglu & Gündüz (WCS), written out here (C = 1)."""
    pq = p * q
    eps1 = math.log1p(math.expm1(eps) / pq)
    beta = math.exp(eps - eps1)
    eps2 = eps1 + math.log(beta + (1 - beta) * p * (1 - q) / (1 - pq))
    a, b = 1 / (2 * sigma), sigma * eps2
    return pq * (stats.norm.cdf(a - b) - math.exp(eps2) * stats.norm.cdf(-a - b))


def test_participants_only_is_priced_by_wcs_and_charged():
    ds = _digits(50)
    alg = _build(ds, sigma=2.0, server="untrusted-participants")
    stats_ = DataStats.of(ds)
    plan = plan_privacy(
        DsgdRandomParticipation,
        alg.params,
        stats_,
        epsilon=math.inf,
        delta=1e-5,
        rounds=1,
        noise_multiplier=2.0,
    )
    assert plan.analysis == "wcs"
    for analysis in ("sound", "paper", "cs"):
        with pytest.raises(InvalidParameterError, match="analysis must be one of"):
            plan_privacy(
                DsgdRandomParticipation,
                alg.params,
                stats_,
                epsilon=math.inf,
                delta=1e-5,
                rounds=1,
                noise_multiplier=2.0,
                analysis=analysis,
                allow_unproven=True,
            )
    assert (
        plan_privacy(
            DsgdRandomParticipation,
            alg.params,
            stats_,
            epsilon=math.inf,
            delta=1e-5,
            rounds=1,
            noise_multiplier=2.0,
            analysis="ols",
        ).analysis
        == "ols"
    )
    # The trusted server keeps every analysis.
    assert DsgdRandomParticipation.valid_analyses(_build(ds).params) is None
    # One round is charged, and its ε under WCS solves Theorem 5.2 at δ = 1e-5
    # (independent closed form above): the ledger's ε is an upper bound, so
    # δ_5.2(ε) <= 1e-5, and tight to the accountant's discretisation (within
    # 2% in ε, the ledger's tolerance).
    ledger = PrivacyLedger(analysis=plan.analysis)
    trainer = Trainer(alg, ledger=ledger, seed=0)
    trainer.step()
    assert ledger.rounds == 1
    eps = ledger.epsilon(1e-5).upper
    assert _wcs_delta(eps, 0.5, 0.5, 2.0) <= 1e-5 * (1 + 1e-9)
    assert _wcs_delta(eps / 1.02, 0.5, 0.5, 2.0) > 1e-5
    # A round abandoned after the messages left is charged (they are releases).
    plan_ = trainer.begin_round()
    trainer.abandon_round(plan_, sent=True)
    assert ledger.rounds == 2


# ----------------------------------------------------------------- presets, end to end
PRESETS = PRESET_DIR


def _run_preset(name, tmp_path, *extra):
    from dpfl.experiments.config import load_config
    from dpfl.experiments.runner import run

    config = load_config(
        PRESETS / f"{name}.yaml",
        [
            f"output_dir={tmp_path}",
            "rounds=2",
            "eval_every=1",
            "privacy.noise_multiplier=2.0",
            *extra,
        ],
    )
    return run(config, progress=False)


def test_participants_only_preset_reports_only_the_analyses_that_hold(tmp_path):
    # From YAML through the runner: the run is priced by WCS, and the report
    # leaves out the analyses that hide participation (sound, paper, cs).
    result = _run_preset("digits-dsgd-rp-untrusted-participants", tmp_path)
    assert result.rounds_completed == 2
    g = result.guarantee
    assert g["analysis"] == "wcs" and g["status"] == "proven"
    assert set(g["analyses"]) == {"wcs", "ols"}
    assert "who took part" in g["adversary"]


def test_availability_preset_runs_with_fewer_clients_online(tmp_path):
    result = _run_preset("digits-dsgd-rp-availability", tmp_path)
    assert result.rounds_completed == 2
    assert result.guarantee["analysis"] == "sound"  # the default, proven
    assert set(result.guarantee["analyses"]) >= {"wcs", "sound", "ols"}


def test_a_hand_built_trainer_refuses_an_analysis_of_another_mechanism():
    # The participants-only untrusted server makes participation visible: only
    # wcs/ols describe it, also when the Trainer is assembled by hand.
    from dpfl.accounting.ledger import PrivacyLedger
    from dpfl.errors import InvalidParameterError
    from dpfl.sim.loop import Trainer

    algorithm = _build(_digits(20), server="untrusted-participants")
    with pytest.raises(InvalidParameterError, match="ledger.analysis must be one of"):
        Trainer(algorithm, ledger=PrivacyLedger(analysis="sound"), seed=0)
    # no analysis would mean the scheme's default, sound, which hides
    # participation: refused too, the analysis must be named
    with pytest.raises(InvalidParameterError, match="ledger.analysis must be one of"):
        Trainer(algorithm, ledger=PrivacyLedger(), seed=0)
    Trainer(algorithm, ledger=PrivacyLedger(analysis="wcs"), seed=0)  # accepted
