"""LOCKS: ledger events, per-client views, unbiasedness of the two-stage estimators."""

import dataclasses
import decimal
import math

import numpy as np
import pytest
import torch
import yaml

from dpfl.accounting import events as ev
from dpfl.accounting import gaussian
from dpfl.accounting import reports as acc_reports
from dpfl.accounting.ledger import PrivacyLedger
from dpfl.data import FederatedDataset, get_dataset
from dpfl.errors import InvalidParameterError
from dpfl.experiments.presets import PRESET_DIR
from dpfl.models import LogisticRegression, build_model
from dpfl.sim.algorithms import build_algorithm
from dpfl.sim.algorithms.base import DataStats
from dpfl.sim.algorithms.locks import Locks
from dpfl.sim.algorithms.locks_params import LocksParams, recorded_max_p2
from dpfl.sim.algorithms.tasks import Task
from dpfl.sim.loop import Trainer
from dpfl.sim.randomness import client_streams
from dpfl.sim.sampling_checkin import TwoStageSampler

PRESET = PRESET_DIR / "locks-digits.yaml"

SETTINGS = dict(
    first_stage_probability=0.3,
    second_stage_size=4,
    norm_noise_ratio=5.0,
    clip=1.0,
    local_steps=2,
    batch_size=8,
    local_learning_rate=0.5,
)


def _digits(num_clients=40):
    return get_dataset("digits", num_clients=num_clients, seed=0, flatten=True)


def _locks(ds, sigma=1.0, seed=0, **kw):
    torch.manual_seed(seed)
    model = build_model(
        "logistic_regression", input_shape=ds.input_shape, num_classes=ds.num_classes
    )
    return build_algorithm(
        "locks",
        {**SETTINGS, **kw},
        model=model,
        dataset=ds,
        noise_multiplier=sigma,
    )


def _tiny(num_clients=12, dim=2):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(num_clients, dim)).astype(np.float32)
    y = (rng.random(num_clients) < 0.5).astype(np.int64)
    return FederatedDataset(
        features=x,
        labels=y,
        client_indices=[np.array([k]) for k in range(num_clients)],
        num_classes=2,
    )


def _tiny_locks(sigma=1.0, **kw):
    torch.manual_seed(0)
    return Locks(
        LocksParams(**{**SETTINGS, **kw}),
        model=LogisticRegression(2, 2),
        dataset=_tiny(),
        noise_multiplier=sigma,
    )


# ----------------------------------------------------------- parameters and events
def test_preset_parameters_are_the_params_fields():
    cfg = yaml.safe_load(PRESET.read_text())
    params = LocksParams(**cfg["algorithm"]["params"])
    assert params.second_stage_size == 10 and params.norm_noise_ratio == 4.0
    assert params.floor == pytest.approx(0.01)  # ν defaults to 0.01 C
    assert "noise_multiplier" not in {f.name for f in dataclasses.fields(LocksParams)}


def test_round_event_is_pure_and_the_two_noises_move_together():
    params = LocksParams(**SETTINGS)
    stats = DataStats(num_clients=30, client_sizes=(5,) * 30)
    e = Locks.round_event(params, stats, 2.0)
    # Before the round only max p2 <= 1 is known; σ_n = norm_noise_ratio · σ_g.
    assert e == ev.TwoStage(0.3, 4, 1.0, ev.Gaussian(10.0), ev.Gaussian(2.0))
    assert ev.scale_noise(Locks.round_event(params, stats, 1.0), 2.0) == e
    assert Locks.round_event(params, stats, 2.0, round_index=7) == e


def test_two_stage_sampler():
    sampler = TwoStageSampler(
        num_clients=50,
        first_stage_probability=0.4,
        second_stage_size=2,
        client_sizes=np.full(50, 3),
    )
    s1 = sampler.first_stage(np.random.default_rng(0))
    assert np.all(np.diff(s1) > 0) and 0 < len(s1) < 50
    norms = np.array([1.0, 1.0, 2.0, 4.0])
    p2 = sampler.second_stage_probabilities(norms)
    np.testing.assert_allclose(p2, [0.25, 0.25, 0.5, 1.0])  # min(1, m2 ω)
    chosen, p2b = sampler.second_stage(np.random.default_rng(1), norms)
    np.testing.assert_array_equal(p2, p2b)
    assert 3 in chosen  # p2 = 1
    assert sampler.second_stage(np.random.default_rng(1), np.empty(0))[0].size == 0
    with pytest.raises(InvalidParameterError):
        sampler.second_stage_probabilities(np.array([1.0, 0.0]))
    assert sampler.event(4.0, 1.0) == ev.TwoStage(
        0.4, 2, 1.0, ev.Gaussian(4.0), ev.Gaussian(1.0)
    )
    # The first stage is Poisson(q1): mean size 0.4 · 50 = 20 (5 s.e.).
    rng = np.random.default_rng(2)
    sizes = [len(sampler.first_stage(rng)) for _ in range(2000)]
    assert abs(np.mean(sizes) - 20) < 5 * math.sqrt(50 * 0.4 * 0.6 / 2000)


def test_expected_second_stage_size_against_closed_forms():
    from scipy import stats

    sampler = TwoStageSampler(
        num_clients=30,
        first_stage_probability=0.4,
        second_stage_size=5,
        client_sizes=np.full(30, 3),
    )
    # Without norm noise and equal norms, p2_k = min(1, m2 / |S1|), so
    # E|S2| = E[min(|S1|, m2)] with |S1| ~ Binomial(K, q1): computed exactly
    # here; the Monte Carlo (40,000 draws, s.e. < 0.01) within 0.05.
    n = np.arange(31)
    exact = float(np.sum(np.minimum(n, 5) * stats.binom.pmf(n, 30, 0.4)))
    got = sampler.expected_second_stage_size(
        1.0, norm_noise=0.0, floor=0.01, rng=np.random.default_rng(0), draws=40_000
    )
    assert got == pytest.approx(exact, abs=0.05)
    # Every p2 = 1 (m2 = K, every released norm at a floor far above the
    # norms and their noise, as the uniform baseline's preset does): every
    # S1 client uploads, E|S2| = K q1.
    everyone = TwoStageSampler(
        num_clients=30,
        first_stage_probability=0.4,
        second_stage_size=30,
        client_sizes=np.full(30, 3),
    )
    got = everyone.expected_second_stage_size(
        np.linspace(0.1, 1.0, 30),
        norm_noise=3.0,
        floor=1e9,
        rng=np.random.default_rng(1),
        draws=40_000,
    )
    assert got == pytest.approx(12.0, abs=0.05)  # s.e. 2.7 / 200
    # Noisy norms make some p2 hit the cap: E|S2| < m2 (Lemma 4.1's bound).
    noisy = sampler.expected_second_stage_size(
        1.0, norm_noise=6.0, floor=0.01, rng=np.random.default_rng(2), draws=20_000
    )
    assert noisy < exact
    for bad in (
        {"norms": np.ones(3)},
        {"norms": -1.0},
        {"norm_noise": -1.0},
        {"floor": 0.0},
        {"draws": 0},
    ):
        kwargs = {"norms": 1.0, "norm_noise": 1.0, "floor": 0.01, **bad}
        with pytest.raises(InvalidParameterError):
            sampler.expected_second_stage_size(rng=np.random.default_rng(0), **kwargs)


# --------------------------------------------------------------- ledger and views
def test_trainer_records_two_stage_rounds_and_both_views():
    ds = _digits()
    alg = _locks(ds)
    ledger = PrivacyLedger(None)
    reports = Trainer(alg, ledger=ledger, seed=0).run(5)

    assert ledger.rounds == 5
    n1, n2 = np.zeros(ds.num_clients, int), np.zeros(ds.num_clients, int)
    for rep, entry in zip(reports, ledger.entries):
        e = entry.event
        assert e == alg.event()  # the event checked before the round
        assert (e.first_stage_probability, e.second_stage_size) == (0.3, 4)
        assert e.norm_event == ev.Gaussian(5.0) and e.update_event == ev.Gaussian(1.0)
        assert entry.participants == tuple(int(k) for k in rep.participants)
        s2 = entry.extra["second_stage"]
        assert set(s2) <= set(entry.participants)  # S2 ⊆ S1
        assert len(s2) == rep.metrics["second_stage"]
        # The realised max p2 is a fact of the round, recorded rounded up to
        # four significant digits.
        assert entry.extra["max_p2"] == recorded_max_p2(rep.metrics["max_p2"])
        assert rep.metrics["max_p2"] <= entry.extra["max_p2"] <= 1
        n1[list(entry.participants)] += 1
        n2[s2] += 1
    rep = Locks.paper_report(alg.params, alg.stats, 1.0, ledger, 1e-5)
    assert rep == acc_reports.locks_report(
        ledger,
        noise_multiplier=1.0,
        norm_noise_ratio=5.0,
        event=alg.event(),
        delta=1e-5,
    )
    server = rep["server_view"]
    k = server["client"]
    # The worst client maximises the GDP mu = sqrt(N1/σn² + N2/σg²) (exact
    # Gaussian composition, Dong-Roth-Su Cor. 3.3), with N1, N2 from the ledger.
    mus = np.sqrt(n1 / 25.0 + n2 / 1.0)
    assert server["mu"] == pytest.approx(mus.max(), rel=1e-12)
    assert server["mu"] == pytest.approx(mus[k], rel=1e-12)
    assert server["epsilon"] == pytest.approx(
        gaussian.gdp_epsilon(1e-5, mu=mus.max()), rel=1e-9
    )
    # Replace-one doubles the update's sensitivity: mu' = sqrt(N1/σn² + 4 N2/σg²).
    assert server["epsilon_replace_one"] == pytest.approx(
        gaussian.gdp_epsilon(1e-5, mu=math.sqrt(n1[k] / 25 + 4 * n2[k])), rel=1e-9
    )
    # The ledger's own figure for that client is the same exact composition.
    assert server["epsilon_ledger"] == pytest.approx(server["epsilon"], rel=1e-9)
    # Observer view: bounded by the server's (the noise is added by clients,
    # so the aggregate reveals who took part: no amplification is claimed).
    obs = rep["observer_view"]
    assert obs["epsilon"] == pytest.approx(server["epsilon"], rel=1e-12)
    assert obs["status"] == "proven" and "released models" in obs["adversary"]
    assert Locks.paper_report(alg.params, alg.stats, 0.0, ledger, 1e-5) is None


def test_locks_report_needs_a_delta_without_a_budget():
    with pytest.raises(InvalidParameterError):
        acc_reports.locks_report(
            PrivacyLedger(None),
            noise_multiplier=1.0,
            norm_noise_ratio=4.0,
            event=ev.TwoStage(0.5, 2, 1.0, ev.Gaussian(4.0), ev.Gaussian(1.0)),
        )


# ------------------------------------------------------------------ clients
def test_client_messages_carry_noisy_update_and_norm_from_own_streams():
    alg = _locks(_digits(20), sigma=0.5)
    w = alg.weights
    task = Task(5)
    clipped = alg.clipped_updates(w, np.array([5]), [client_streams(3, 0, 5).rng])[0]
    assert float(clipped.norm()) <= 1.0 + 1e-6
    m = alg.client_step(w, task, client_streams(3, 0, 5))
    # Same client, same streams: the same message; another round's streams differ.
    again = alg.client_step(w, task, client_streams(3, 0, 5))
    assert torch.equal(m.vector, again.vector) and m.scalars == again.scalars
    other = alg.client_step(w, task, client_streams(3, 1, 5))
    assert not torch.equal(m.vector, other.vector)
    # The update noise is σ_g C per coordinate around ḡ.
    assert float((m.vector - clipped).std()) == pytest.approx(0.5, rel=0.1)
    assert m.scalars["noisy_norm"] >= alg.params.floor


def test_noisy_norms_are_floored_and_have_std_sigma_n_c():
    alg = _tiny_locks(clip=2.0, norm_noise_ratio=0.5, norm_floor=0.1)
    gen = torch.Generator().manual_seed(0)
    g = torch.zeros(alg.num_weights, dtype=torch.float64)
    g[0] = 1.5
    out = np.array([alg.release(g, gen)[1] for _ in range(4000)])
    assert out.min() >= 0.1
    # ‖ḡ‖ = 1.5, std σ_n C = 1: the floor at 0.1 clips P(N(1.5,1) < 0.1) ≈ 8%.
    floored = float((out == 0.1).mean())
    p = 0.5 * math.erfc((1.5 - 0.1) / math.sqrt(2))
    assert abs(floored - p) < 5 * math.sqrt(p * (1 - p) / 4000)
    assert abs(float(np.median(out[out > 0.1])) - 1.5) < 0.1


def test_non_private_release_draws_no_noise():
    alg = _tiny_locks(sigma=0.0)
    g = torch.zeros(alg.num_weights)
    g[1] = 0.7
    gen = torch.Generator().manual_seed(0)
    state = gen.get_state()
    noisy, norm = alg.release(g, gen)
    assert torch.equal(noisy, g) and norm == pytest.approx(0.7)
    assert torch.equal(gen.get_state(), state)
    assert alg.event() is None


# ------------------------------------------------------------------ estimators
def _fixed_updates(alg, num_clients, seed=0):
    """Fixed clipped updates with very different norms (<= C)."""
    gen = torch.Generator().manual_seed(seed)
    g = torch.randn(num_clients, alg.num_weights, generator=gen, dtype=torch.float64)
    g = g / g.norm(dim=1, keepdim=True)
    return g * torch.linspace(0.05, 1.0, num_clients, dtype=torch.float64)[:, None]


@pytest.mark.slow  # default run under 4 minutes; .ci/run runs it (-m slow)
@pytest.mark.parametrize("second_stage_size", [3, 12])
def test_unbiased_estimator_monte_carlo(second_stage_size):
    # E[ĝ_A] = (1/K) Σ_k ḡ_k over S1, the noisy norms, S2 and the noise
    # (Lemma 4.2), with and without the cap p2 <= 1 binding (m2 = 12 > |S1|).
    # Tolerance: 5 standard errors per coordinate (sample std / sqrt(trials)).
    alg = _tiny_locks(
        sigma=0.2, second_stage_size=second_stage_size, norm_noise_ratio=25.0
    )
    sampler = Locks.sampler(alg.params, alg.stats)
    gbar = _fixed_updates(alg, alg.stats.num_clients)
    target = gbar.mean(0)
    rng = np.random.default_rng(7)
    gen = torch.Generator().manual_seed(7)
    trials = 6000
    out = torch.empty(trials, alg.num_weights, dtype=torch.float64)
    capped = 0
    for t in range(trials):
        s1 = sampler.first_stage(rng)
        sent = [alg.release(gbar[k], gen) for k in s1]
        noisy = (
            torch.stack([u for u, _ in sent])
            if sent
            else gbar.new_zeros(0, alg.num_weights)
        )
        out[t], info = alg.aggregate(noisy, np.array([n for _, n in sent]), rng)
        capped += info["max_p2"] == 1.0
    se = out.std(0) / math.sqrt(trials)
    assert torch.all((out.mean(0) - target).abs() < 5 * se), (out.mean(0), target, se)
    if second_stage_size == 12:
        assert capped > trials / 2  # the cap binds, and (A) stays unbiased


def test_weighted_estimator_matches_the_omega_weighted_aggregate():
    # Given S1 and ñ, E[ĝ_B] = Σ_{k∈S1} ω_k ḡ_k when m2 max ω <= 1 (Lemma 5.2);
    # it is not the uniform mean. Monte Carlo over S2 and the noise, 5 s.e.
    alg = _tiny_locks(sigma=0.2, second_stage_size=3, norm_noise_ratio=25.0)
    gbar = _fixed_updates(alg, alg.stats.num_clients)
    norms = (gbar.norm(dim=1) + 0.01).numpy()  # released norms, fixed
    omega = norms / norms.sum()
    assert 3 * omega.max() <= 1
    target = torch.as_tensor(omega) @ gbar
    rng = np.random.default_rng(3)
    gen = torch.Generator().manual_seed(3)
    trials = 6000
    out = torch.empty(trials, alg.num_weights, dtype=torch.float64)
    for t in range(trials):
        noisy = gbar + 0.2 * torch.randn(gbar.shape, generator=gen, dtype=gbar.dtype)
        out[t], info = alg.aggregate(noisy, norms, rng, estimator="weighted")
    assert np.allclose(info["omega"], omega)
    se = out.std(0) / math.sqrt(trials)
    assert torch.all((out.mean(0) - target).abs() < 5 * se)
    assert (target - gbar.mean(0)).abs().max() > 20 * se.max()


def test_variance_schedule_step_size():
    alg = _tiny_locks(server_learning_rate=1.0)
    assert alg.step_size(0, 0.0) == 1.0
    assert alg.step_size(3, 3.0) == pytest.approx(1 / 4)  # C² / (C² + V)
    gbar = _fixed_updates(alg, 12).to(torch.float32)
    norms = gbar.norm(dim=1).double().numpy()
    _, info = alg.aggregate(gbar, norms, np.random.default_rng(0))
    idx = info["chosen"]
    pi = 0.3 * info["p2"][idx]
    a = 1 / (12 * pi)
    v = np.sum(a**2 * ((1 - pi) * norms[idx] ** 2 + alg.num_weights * 1.0))
    assert info["variance"] == pytest.approx(v, rel=1e-9)
    inv = _tiny_locks(server_schedule="inverse-sqrt")
    assert inv.step_size(3, 100.0) == pytest.approx(0.5)
    assert _tiny_locks(server_schedule="constant").step_size(9, 5.0) == 1.0


# ------------------------------------------------------------------- training
@pytest.mark.slow  # default run under 4 minutes; .ci/run runs it (-m slow)
def test_training_on_digits_improves_accuracy_and_is_seeded():
    # (loop = batched is the contract suite's; the batched executor here.)
    ds = _digits(20)
    kw = dict(
        first_stage_probability=0.5,
        second_stage_size=8,
        norm_noise_ratio=40.0,
        local_steps=3,
        server_learning_rate=1.0,
    )
    alg = _locks(ds, sigma=0.05, **kw)
    before = alg.evaluate()["test_accuracy"]
    Trainer(alg, ledger=PrivacyLedger(None), seed=0, secure_noise=False).run(15)
    after = alg.evaluate()["test_accuracy"]
    assert after > before + 0.3  # 10 classes: chance is 0.1
    again = _locks(ds, sigma=0.05, **kw)
    Trainer(again, ledger=PrivacyLedger(None), seed=0, secure_noise=False).run(15)
    assert torch.equal(alg.weights, again.weights)


def test_validation():
    for bad in (
        dict(first_stage_probability=0.0),
        dict(second_stage_size=0),
        dict(norm_noise_ratio=0.0),
        dict(clip=0.0),
        dict(local_steps=0),
        dict(estimator="mean"),
        dict(server_schedule="adam"),
        dict(norm_floor=-1.0),
    ):
        with pytest.raises(InvalidParameterError):
            LocksParams(**{**SETTINGS, **bad})
    with pytest.raises(InvalidParameterError):
        _tiny_locks(sigma=-1.0)  # σ is validated once, by the base
    empty = FederatedDataset(
        features=np.zeros((2, 2), np.float32),
        labels=np.zeros(2, np.int64),
        client_indices=[np.array([0, 1]), np.array([], np.int64)],
        num_classes=2,
    )
    with pytest.raises(InvalidParameterError, match="record"):
        Locks(LocksParams(), model=LogisticRegression(2, 2), dataset=empty)


def test_the_ledger_records_max_p2_rounded_up_to_four_digits():
    # Executors and devices compute the released norms in other float orders
    # (a GPU: ~1e-10 relative apart); the entry holds max p2 at a precision
    # that rounding cannot reach, rounded up (an upper bound of the value).
    assert recorded_max_p2(0.9516712232551217) == 0.9517
    assert recorded_max_p2(0.9516712232551217 - 5e-11) == 0.9517  # other executor
    assert recorded_max_p2(1.0) == 1.0 and recorded_max_p2(0.0) == 0.0
    assert recorded_max_p2(0.5) == 0.5 and recorded_max_p2(0.1) == 0.1
    assert recorded_max_p2(1 / 3) == 0.3334 and recorded_max_p2(0.99999999) == 1.0
    rng = np.random.default_rng(3)
    for value in rng.uniform(1e-6, 1.0, 2000):
        kept = recorded_max_p2(float(value))
        assert value <= kept <= value * (1 + 1e-3)
        assert len(decimal.Decimal(repr(kept)).normalize().as_tuple().digits) <= 4
