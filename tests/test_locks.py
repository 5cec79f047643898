"""LOCKS: ledger events, per-client views, unbiasedness of the two-stage estimators."""

import math

import numpy as np
import pytest
import torch

from dpfl.accounting import events as ev
from dpfl.accounting import gaussian
from dpfl.accounting.ledger import PrivacyLedger
from dpfl.data import FederatedDataset, get_dataset
from dpfl.errors import InvalidParameterError
from dpfl.models import LogisticRegression, build_model
from dpfl.sim.algorithms.locks import Locks
from dpfl.sim.loop import Trainer, round_generators

SETTINGS = dict(
    first_stage_probability=0.3,
    second_stage_size=4,
    noise_multiplier=1.0,
    norm_noise_ratio=5.0,
    clip=1.0,
    local_steps=2,
    batch_size=8,
    local_learning_rate=0.5,
)


def _digits(num_clients=40):
    return get_dataset("digits", num_clients=num_clients, seed=0, flatten=True)


def _locks(ds, seed=0, **kw):
    torch.manual_seed(seed)
    model = build_model(
        "logistic_regression", input_shape=ds.input_shape, num_classes=ds.num_classes
    )
    return Locks(model=model, dataset=ds, **{**SETTINGS, **kw})


def _run(alg, ledger, rounds, seed=0):
    """The round loop with the realised event and the second stage recorded."""
    for t in range(rounds):
        rng, gen = round_generators(seed, t)
        ledger.check(alg.event())
        s1, _ = alg.run_round(t, rng, gen)
        ledger.record(
            alg.realised_event(), participants=s1, round=t, extra=alg.ledger_extra()
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


# --------------------------------------------------------------- ledger and views
def test_seeded_run_records_two_stage_events_and_both_views():
    ds = _digits()
    alg = _locks(ds)
    ledger = PrivacyLedger(None)
    _run(alg, ledger, 5)

    assert ledger.rounds == 5
    n1, n2 = np.zeros(ds.num_clients, int), np.zeros(ds.num_clients, int)
    for entry in ledger.entries:
        e = entry.event
        assert isinstance(e, ev.TwoStage)
        assert (e.first_stage_probability, e.second_stage_size) == (0.3, 4)
        assert e.norm_event == ev.Gaussian(5.0) and e.update_event == ev.Gaussian(1.0)
        assert 0 < e.max_second_stage_probability <= 1
        s2 = entry.extra["second_stage"]
        assert set(s2) <= set(entry.participants)  # S2 ⊆ S1
        n1[list(entry.participants)] += 1
        n2[s2] += 1
    rep = alg.privacy_report(ledger, delta=1e-5)
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


def test_trainer_records_both_stages_through_the_trainer():
    ds = _digits()
    alg = _locks(ds)
    ledger = PrivacyLedger(None)
    reports = Trainer(alg, ledger=ledger, seed=1).run(3)
    for rep, entry in zip(reports, ledger.entries):
        # The realised event (this round's max p2) prices like the checked one.
        assert (
            entry.event.first_stage_probability == alg.event().first_stage_probability
        )
        assert entry.participants == tuple(int(k) for k in rep.participants)
        second = entry.extra["second_stage"]
        assert set(second) <= set(entry.participants)  # S2 is a subset of S1
    out = alg.privacy_report(ledger, delta=1e-5)
    # The server view's mu is the exact Gaussian composition of the recorded
    # counts: mu^2 = N1/σn² + N2/σg² for the worst client (integers N1, N2).
    mu2 = out["server_view"]["mu"] ** 2
    counts = {}
    for entry in ledger.entries:
        for k in entry.participants:
            n1, n2 = counts.get(k, (0, 0))
            counts[k] = (n1 + 1, n2 + (k in entry.extra["second_stage"]))
    best = max(n1 / 25 + n2 / 1.0 for n1, n2 in counts.values())
    assert mu2 == pytest.approx(best, rel=1e-9)


# ------------------------------------------------------------------ estimators
def _fixed_updates(alg, num_clients, seed=0):
    """Fixed clipped updates with very different norms (<= C)."""
    gen = torch.Generator().manual_seed(seed)
    g = torch.randn(num_clients, alg.dim, generator=gen, dtype=torch.float64)
    g = g / g.norm(dim=1, keepdim=True)
    return g * torch.linspace(0.05, 1.0, num_clients, dtype=torch.float64)[:, None]


@pytest.mark.parametrize("second_stage_size", [3, 12])
def test_unbiased_estimator_monte_carlo(second_stage_size):
    # E[ĝ_A] = (1/K) Σ_k ḡ_k over S1, the noisy norms, S2 and the noise
    # (Lemma 4.2), with and without the cap p2 <= 1 binding (m2 = 12 > |S1|).
    # Tolerance: 5 standard errors per coordinate (sample std / sqrt(trials)).
    ds = _tiny()
    torch.manual_seed(0)
    alg = Locks(
        model=LogisticRegression(2, 2),
        dataset=ds,
        **{
            **SETTINGS,
            "second_stage_size": second_stage_size,
            "noise_multiplier": 0.2,
            "norm_noise_ratio": 25.0,
        },
    )
    gbar = _fixed_updates(alg, ds.num_clients)
    target = gbar.mean(0)
    rng = np.random.default_rng(7)
    gen = torch.Generator().manual_seed(7)
    trials = 6000
    out = torch.empty(trials, alg.dim, dtype=torch.float64)
    capped = 0
    for t in range(trials):
        s1 = alg.first_stage(rng)
        norms = alg.noisy_norms(gbar[s1], gen)
        out[t], info = alg.second_stage(s1, gbar[s1], norms, rng, gen)
        capped += info["max_p2"] == 1.0
    se = out.std(0) / math.sqrt(trials)
    assert torch.all((out.mean(0) - target).abs() < 5 * se), (out.mean(0), target, se)
    if second_stage_size == 12:
        assert capped > trials / 2  # the cap binds, and (A) stays unbiased


def test_weighted_estimator_matches_the_omega_weighted_aggregate():
    # Given S1 and ñ, E[ĝ_B] = Σ_{k∈S1} ω_k ḡ_k when m2 max ω <= 1 (Lemma 5.2);
    # it is not the uniform mean. Monte Carlo over S2 and the noise, 5 s.e.
    ds = _tiny()
    alg = Locks(
        model=LogisticRegression(2, 2),
        dataset=ds,
        **{
            **SETTINGS,
            "second_stage_size": 3,
            "noise_multiplier": 0.2,
            "norm_noise_ratio": 25.0,
        },
    )
    gbar = _fixed_updates(alg, ds.num_clients)
    s1 = np.arange(ds.num_clients)
    norms = gbar.norm(dim=1) + 0.01  # released norms, fixed
    omega = (norms / norms.sum()).to(torch.float64)
    assert float(3 * omega.max()) <= 1
    target = omega @ gbar
    rng = np.random.default_rng(3)
    gen = torch.Generator().manual_seed(3)
    trials = 6000
    out = torch.empty(trials, alg.dim, dtype=torch.float64)
    for t in range(trials):
        out[t], info = alg.second_stage(s1, gbar, norms, rng, gen, estimator="weighted")
    assert np.allclose(info["omega"], omega.numpy())
    se = out.std(0) / math.sqrt(trials)
    assert torch.all((out.mean(0) - target).abs() < 5 * se)
    assert (target - gbar.mean(0)).abs().max() > 20 * se.max()


def test_noisy_norms_are_floored_and_have_std_sigma_n_c():
    ds = _tiny()
    alg = Locks(
        model=LogisticRegression(2, 2),
        dataset=ds,
        **{**SETTINGS, "clip": 2.0, "norm_noise_ratio": 0.5},
        norm_floor=0.1,
    )
    g = torch.zeros(4000, alg.dim, dtype=torch.float64)
    g[:, 0] = 1.5
    out = alg.noisy_norms(g, torch.Generator().manual_seed(0))
    assert float(out.min()) >= 0.1
    # ‖ḡ‖ = 1.5, std σ_n C = 1: the floor at 0.1 clips P(N(1.5,1) < 0.1) ≈ 8%.
    floored = float((out == 0.1).double().mean())
    p = 0.5 * math.erfc((1.5 - 0.1) / math.sqrt(2))
    assert abs(floored - p) < 5 * math.sqrt(p * (1 - p) / 4000)
    above = out[out > 0.1]
    assert abs(float(above.median()) - 1.5) < 0.1


def test_variance_schedule_step_size():
    ds = _tiny()
    alg = Locks(model=LogisticRegression(2, 2), dataset=ds, **SETTINGS)
    assert alg.step_size(0, 0.0) == 1.0
    assert alg.step_size(3, 3.0) == pytest.approx(1 / 4)  # C² / (C² + V)
    gbar = _fixed_updates(alg, 12).to(torch.float32)
    s1 = np.arange(12)
    norms = gbar.norm(dim=1).double()
    _, info = alg.second_stage(
        s1, gbar, norms, np.random.default_rng(0), torch.Generator().manual_seed(0)
    )
    idx = np.searchsorted(s1, info["second_stage"])
    pi = 0.3 * info["p2"][idx]
    a = 1 / (12 * pi)
    v = np.sum(a**2 * ((1 - pi) * norms.numpy()[idx] ** 2 + alg.dim * 1.0))
    assert info["variance"] == pytest.approx(v, rel=1e-9)
    inv = Locks(
        model=LogisticRegression(2, 2),
        dataset=ds,
        **SETTINGS,
        server_schedule="inverse-sqrt",
    )
    assert inv.step_size(3, 100.0) == pytest.approx(0.5)


# ------------------------------------------------------------------- training
def test_training_on_digits_improves_accuracy_and_is_seeded():
    ds = _digits(20)
    kw = dict(
        first_stage_probability=0.5,
        second_stage_size=8,
        noise_multiplier=0.05,
        norm_noise_ratio=40.0,
        local_steps=3,
        server_learning_rate=1.0,
    )
    alg = _locks(ds, **kw)
    before = alg.evaluate()["test_accuracy"]
    _run(alg, PrivacyLedger(None), 15)
    after = alg.evaluate()["test_accuracy"]
    assert after > before + 0.3  # 10 classes: chance is 0.1
    again = _locks(ds, **kw)
    _run(again, PrivacyLedger(None), 15)
    assert all(
        torch.equal(a, b)
        for a, b in zip(alg.model.parameters(), again.model.parameters())
    )


def test_validation():
    ds = _tiny()
    for bad in (
        dict(first_stage_probability=0.0),
        dict(second_stage_size=0),
        dict(norm_noise_ratio=0.0),
        dict(noise_multiplier=0.0),
        dict(estimator="mean"),
        dict(server_schedule="adam"),
        dict(norm_floor=-1.0),
    ):
        with pytest.raises(InvalidParameterError):
            Locks(model=LogisticRegression(2, 2), dataset=ds, **{**SETTINGS, **bad})
