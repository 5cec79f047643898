"""PriFedSync: seeded runs, ledger events, helper models, noise convention, Adam."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from scipy import special, stats

from dpfl.accounting import events as ev
from dpfl.accounting import fdp
from dpfl.accounting.accountant import Accountant
from dpfl.accounting.ledger import PrivacyLedger
from dpfl.data import get_dataset
from dpfl.errors import InvalidParameterError
from dpfl.models import build_model
from dpfl.sim.algorithms.prifedsync import PriFedSync
from dpfl.sim.loop import Algorithm, Trainer, round_generators

DELTA = 1e-5


def _digits(num_clients=20, shards_per_client=2):
    return get_dataset(
        "digits",
        flatten=True,
        partition="shards",
        num_clients=num_clients,
        shards_per_client=shards_per_client,
        client_test_records=30,
        seed=0,
    )


def _algorithm(ds, seed=0, model="logistic_regression", **kw):
    torch.manual_seed(seed)
    net = build_model(model, input_shape=ds.input_shape, num_classes=ds.num_classes)
    params = dict(
        sync_probability=0.5,
        noise_multiplier=1.0,
        batch_size=4,
        local_steps=3,
        learning_rate=0.05,
    )
    params.update(kw)
    return PriFedSync(model=net, dataset=ds, **params)


def _run(alg, rounds, seed=0):
    ledger = PrivacyLedger(None)
    trainer = Trainer(alg, ledger=ledger, seed=seed)
    reports = trainer.run(rounds)
    return ledger, reports


# -- runs and the ledger ---------------------------------------------------------
def test_short_seeded_run_records_one_event_per_round_with_synced_clients():
    # Prepare
    ds = _digits()
    alg = _algorithm(ds)
    assert isinstance(alg, Algorithm)
    # Execute
    ledger, reports = _run(alg, 4)
    # Assert
    # A client syncs w.p. p' = p / (1 - (1-p)^m) (Ω is re-drawn while empty),
    # visibly, then runs K noisy steps on uniform batches (replace-one, so the
    # noise std 2Cσ faces sensitivity 2C: the WOR event doubles it).
    p, m = alg.sync_probability, ds.num_clients
    expected = ev.CheckIn(
        p / (1 - (1 - p) ** m),
        ev.SelfComposed(
            ev.WithoutReplacement(4, int(ds.client_sizes().min()), ev.Gaussian(2.0)),
            3,
        ),
    )
    assert ledger.rounds == 4
    for entry, report in zip(ledger.entries, reports, strict=True):
        assert entry.event.event == expected.event
        assert entry.event.probability == pytest.approx(expected.probability)
        assert report.participants.size >= 1  # Ω is re-drawn while empty
        assert entry.participants == tuple(report.participants.tolist())
        assert np.all(np.diff(report.participants) > 0)
    metrics = alg.evaluate()
    for key in ("test_accuracy", "personal_test_accuracy", "global_test_accuracy"):
        assert 0.0 <= metrics[key] <= 1.0


def test_same_seed_same_models_and_different_seed_differs():
    ds = _digits()
    a, b, c = _algorithm(ds), _algorithm(ds), _algorithm(ds)
    _run(a, 3, seed=7)
    _run(b, 3, seed=7)
    _run(c, 3, seed=8)
    assert torch.equal(a.global_flat, b.global_flat)
    assert all(torch.equal(a._local[k], b._local[k]) for k in a._local)
    assert not torch.equal(a.global_flat, c.global_flat)


def test_non_private_run_charges_nothing():
    ds = _digits()
    alg = _algorithm(ds, noise_multiplier=None, clip=None)
    ledger, reports = _run(alg, 2)
    assert alg.event() is None
    assert ledger.rounds == 0
    assert all(r.event is None for r in reports)


def test_reported_epsilon_equals_the_accountants_and_the_exact_fdp_value():
    # Prepare: p = 0.5, so clients sync a different number of rounds.
    ds = _digits()
    alg = _algorithm(ds, batch_size=4, local_steps=3)
    ledger, _ = _run(alg, 6)
    counts = np.zeros(ds.num_clients, int)
    for entry in ledger.entries:
        counts[list(entry.participants)] += 1
    r_max = int(counts.max())
    # Execute
    summary = alg.privacy_summary(ledger, delta=DELTA)
    # Assert: the same computation as the accountant's, exactly.
    acc = Accountant().compose(alg.event().event, count=r_max).epsilon(DELTA)
    assert summary["epsilon"] == acc.upper
    assert summary["max_client_rounds"] == r_max
    # The least-private client is the max over clients of client_epsilon: the
    # client that synced least is charged less (epsilon grows with rounds).
    fewest = int(np.argmin(counts))
    if counts[fewest] < r_max:
        assert ledger.client_epsilon(fewest, DELTA).upper < summary["epsilon"]
    # Independent witness: fdp.exact_epsilon composes C_{B/n}(G_{1/sigma}) for
    # K*R_max steps on its own grid (h = 1e-3); the accountant refines until
    # its bracket is within 2% (docs/analyses.md), so they agree to 3% (relative).
    n = int(ds.client_sizes().min())
    exact = fdp.exact_epsilon(
        DELTA,
        noise_multiplier=1.0,
        batch_size=4,
        records_per_client=n,
        local_steps=3,
        rounds=r_max,
    )
    assert summary["epsilon"] == pytest.approx(exact.upper, rel=0.03)
    weak = summary["weak"]
    assert weak.values["epsilon"].upper == pytest.approx(summary["epsilon"], rel=0.03)
    assert weak.values["num_clients"] == ds.num_clients
    assert summary["strong"].values["epsilon"] == weak.values["epsilon"]
    # CLT mu, closed form of Theorem 2 / App. D (docs/analyses.md), to 1e-12:
    # mu = sqrt(2) (B/n) sqrt(K R) sqrt(e^{1/s^2} Phi(1.5/s) + 3 Phi(-0.5/s) - 2).
    h = math.e * special.ndtr(1.5) + 3 * special.ndtr(-0.5) - 2
    mu = math.sqrt(2) * (4 / n) * math.sqrt(3 * r_max) * math.sqrt(h)
    assert summary["mu_clt"] == pytest.approx(mu, rel=1e-12)
    mu_all = math.sqrt(2) * (4 / n) * math.sqrt(3 * 6) * math.sqrt(h)
    assert summary["mu_clt_all_rounds"] == pytest.approx(mu_all, rel=1e-12)
    assert summary["strong_mu_paper"] == pytest.approx(
        math.sqrt(ds.num_clients - 1) * mu, rel=1e-12
    )


# -- helper models ---------------------------------------------------------------
def _one_round(ds, **kw):
    alg = _algorithm(ds, **kw)
    rng, gen = round_generators(3, 0)
    clients, _ = alg.run_round(0, rng, gen)
    return alg, clients


def test_interpolation_weight_one_gives_global_and_zero_keeps_local():
    ds = _digits()
    one, clients = _one_round(ds, interpolation_weight=1.0)
    zero, clients0 = _one_round(ds, interpolation_weight=0.0)
    mid, clients_mid = _one_round(ds, interpolation_weight=0.3)
    # Same seeds -> same Ω and the same trained models (training starts at w0).
    assert np.array_equal(clients, clients0) and np.array_equal(clients, clients_mid)
    assert torch.equal(one.global_flat, zero.global_flat)
    g = one.global_flat
    for k in clients.tolist():
        # alpha = 1: the helper is the global model.
        assert torch.allclose(one._local_flat(k), g, atol=1e-6)
        # alpha = 0: the helper is the client's trained model, not the global.
        assert not torch.allclose(zero._local_flat(k), g, atol=1e-4)
        # eq. (2.1): (1 - a) w^(i) + a w_global, to float32 rounding.
        expected = 0.7 * zero._local_flat(k) + 0.3 * g
        assert torch.allclose(mid._local_flat(k), expected, atol=1e-6)
    # eta = 1: the global model is the mean of the trained local models.
    trained = torch.stack([zero._local_flat(k) for k in clients.tolist()])
    assert torch.allclose(g, trained.mean(0), atol=1e-6)
    # Clients that did not sync keep w0.
    others = sorted(set(range(ds.num_clients)) - set(clients.tolist()))
    assert others
    for k in others:
        assert torch.equal(zero._local_flat(k), zero._initial)


def test_identity_helper_and_aggregation_rate():
    ds = _digits()
    ident, clients = _one_round(ds, helper="identity", aggregation_rate=0.5)
    zero, _ = _one_round(ds, interpolation_weight=0.0)
    trained = torch.stack([zero._local_flat(k) for k in clients.tolist()])
    # w_global = (1 - eta) w0 + eta * mean(trained), eta = 0.5.
    expected = 0.5 * zero._initial + 0.5 * trained.mean(0)
    assert torch.allclose(ident.global_flat, expected, atol=1e-6)
    for k in clients.tolist():
        assert torch.equal(ident._local_flat(k), ident.global_flat)


def test_personal_equals_global_before_training():
    ds = _digits()
    alg = _algorithm(ds)
    m = alg.evaluate()
    assert m["personal_test_accuracy"] == m["global_test_accuracy"]
    assert m["test_loss"] == pytest.approx(m["global_test_loss"], rel=1e-12)


# -- noise convention ------------------------------------------------------------
def _clipped_sum_loop(model, params, x, y, clip):
    """Per-example reference: grad of each example's loss, clipped, summed."""
    total = {k: torch.zeros_like(v) for k, v in params.items()}
    for i in range(x.shape[0]):
        p = {k: v.clone().requires_grad_(True) for k, v in params.items()}
        out = torch.func.functional_call(model, p, (x[i : i + 1],))
        grads = torch.autograd.grad(
            F.cross_entropy(out, y[i : i + 1]), list(p.values())
        )
        norm = torch.sqrt(sum(g.pow(2).sum() for g in grads))
        factor = min(1.0, clip / float(norm))
        for k, g in zip(p, grads):
            total[k] += factor * g
    return total


def test_noise_std_is_two_clip_sigma_on_the_clipped_sum():
    # Prepare: 3 clients, B = 5, sigma = 0.7, C = 0.5 -> std 2*C*sigma = 0.7.
    ds = _digits()
    sigma, clip, b = 0.7, 0.5, 5
    alg = _algorithm(ds, noise_multiplier=sigma, clip=clip, batch_size=b)
    clients = np.array([0, 1, 2])
    x_all, y_all, sizes = alg._client_data(clients)
    theta = alg._initial[None, :].repeat(3, 1)
    xb, yb = x_all[:, :b], y_all[:, :b]
    reference = torch.stack(
        [
            alg._flatten(
                _clipped_sum_loop(
                    alg.model, alg._unflatten(theta[j]), xb[j], yb[j], clip
                )
            )
            for j in range(3)
        ]
    )
    gen = torch.Generator().manual_seed(11)
    # Execute: 4 draws x 3 clients x 650 coordinates = 7,800 noise values.
    noise = torch.cat(
        [
            (alg.noisy_gradient(theta, xb, yb, gen) * b - reference).reshape(-1)
            for _ in range(4)
        ]
    ).double()
    # Assert: chi-square test of the variance, two-sided, false-alarm rate 1e-6
    # (N(0, s^2) noise: sum z^2 / s^2 ~ chi2(N)).
    n = noise.numel()
    s2 = float((noise**2).sum())
    lo, hi = stats.chi2.ppf([0.5e-6, 1 - 0.5e-6], n)
    assert lo <= s2 / (2 * clip * sigma) ** 2 <= hi
    # Opacus' convention (std C*sigma) would be rejected at the same level.
    assert s2 / (clip * sigma) ** 2 > hi
    # Mean zero: z-test, false-alarm rate 1e-6.
    z = float(noise.sum()) / ((2 * clip * sigma) * math.sqrt(n))
    assert abs(z) < stats.norm.ppf(1 - 0.5e-6)


def test_batch_positions_are_uniform_subsets_without_replacement():
    ds = _digits()
    alg = _algorithm(ds, batch_size=3)
    rng = np.random.default_rng(0)
    sizes = np.array([5, 7])
    hits = np.zeros((2, 7))
    draws = 4000
    for _ in range(draws):
        pos = alg.batch_positions(rng, sizes)
        for j in range(2):
            assert len(set(pos[j].tolist())) == 3  # distinct
            assert pos[j].max() < sizes[j]
            hits[j, pos[j]] += 1
    # Each record is in the batch w.p. B/n; chi-square goodness of fit over the
    # n records of each client, false-alarm rate 1e-6 (each).
    for j, n in enumerate(sizes):
        counts = hits[j, :n]
        assert counts.sum() == 3 * draws
        stat = float(((counts - 3 * draws / n) ** 2 / (3 * draws / n)).sum())
        assert stat < stats.chi2.ppf(1 - 1e-6, n - 1)


# -- optimiser and kernels ---------------------------------------------------------
def test_local_adam_matches_torch_adam_client_by_client(monkeypatch):
    # PriFedSync's local Adam (dpfl.sim.local.cohort_adam_step on the stacked
    # synced clients, L2 penalty added to the gradient) equals torch.optim.Adam
    # (weight_decay) run client by client on the same gradients, with one
    # client's moments and step count carried over from an earlier sync
    # (atol 1e-6, float32).
    ds = _digits()
    alg = _algorithm(ds, learning_rate=0.01, betas=(0.8, 0.95), weight_decay=0.1)
    monkeypatch.setattr(
        alg, "noisy_gradient", lambda theta, xb, yb, gen: torch.sin(3.0 * theta) + 0.1
    )
    torch.manual_seed(1)
    p = alg.num_parameters
    alg._local[4] = alg._initial + 0.1 * torch.randn(p)
    alg._moment1[4], alg._moment2[4] = 0.01 * torch.randn(p), 1e-4 * torch.rand(p)
    alg._steps[4] = 5
    clients = np.array([1, 4])
    rng, gen = round_generators(5, 0)
    theta, state = alg.local_training(clients, rng, gen)
    for row, k in enumerate(clients.tolist()):
        param = torch.nn.Parameter(alg._local_flat(k).clone())
        opt = torch.optim.Adam(
            [param], lr=0.01, betas=(0.8, 0.95), eps=1e-8, weight_decay=0.1
        )
        if k in alg._steps:
            opt.state[param] = {
                "step": torch.tensor(float(alg._steps[k])),
                "exp_avg": alg._moment1[k].clone(),
                "exp_avg_sq": alg._moment2[k].clone(),
            }
        for _ in range(alg.local_steps):
            param.grad = torch.sin(3.0 * param.detach()) + 0.1
            opt.step()
        torch.testing.assert_close(theta[row], param.detach(), atol=1e-6, rtol=0)
        torch.testing.assert_close(
            state["moment1"][row], opt.state[param]["exp_avg"], atol=1e-6, rtol=0
        )
        assert int(state["steps"][row]) == int(opt.state[param]["step"])


@pytest.mark.parametrize("model", ["logistic_regression", "mlp"])
def test_per_client_batched_and_ghost_kernels_agree(model):
    ds = _digits()
    algs = [
        _algorithm(ds, model=model, grad_method=g)
        for g in ("batched", "per-client", "ghost", "auto")
    ]
    assert algs[3].grad_method == "ghost"  # auto takes the cross-client ghost kernel
    for alg in algs:
        rng, gen = round_generators(5, 0)
        alg.run_round(0, rng, gen)
    # float32 sums in different orders: 1e-5 absolute.
    for alg in algs[1:]:
        assert torch.allclose(algs[0].global_flat, alg.global_flat, atol=1e-5)


def test_state_dict_resume_is_exact():
    ds = _digits()
    a = _algorithm(ds)
    ledger = PrivacyLedger(None)
    trainer = Trainer(a, ledger=ledger, seed=2)
    trainer.run(2)
    state = trainer.state_dict()
    trainer.step()
    b = _algorithm(ds, seed=5)  # different w0, overwritten by the state
    resumed = Trainer(b, ledger=PrivacyLedger(None), seed=2)
    resumed.ledger._entries = ledger.entries[:2]
    resumed.load_state_dict(state)
    resumed.step()
    assert torch.equal(a.global_flat, b.global_flat)
    assert a._steps == b._steps
    assert all(torch.equal(a._local[k], b._local[k]) for k in a._local)


def test_invalid_parameters_raise():
    ds = _digits()
    with pytest.raises(InvalidParameterError, match="batch_size"):
        _algorithm(ds, batch_size=10_000)
    with pytest.raises(InvalidParameterError, match="helper"):
        _algorithm(ds, helper="median")
    with pytest.raises(InvalidParameterError, match="interpolation_weight"):
        _algorithm(ds, interpolation_weight=1.5)
    with pytest.raises(InvalidParameterError, match="interpolation_weight"):
        _algorithm(ds, interpolation_weight=[0.1, 0.2])
    with pytest.raises(InvalidParameterError, match="sync_probability"):
        _algorithm(ds, sync_probability=0.0)
    with pytest.raises(InvalidParameterError, match="clip"):
        _algorithm(ds, clip=None)
    with pytest.raises(InvalidParameterError, match="grad_method"):
        _algorithm(ds, grad_method="fast")
    norm_net = torch.nn.Sequential(
        torch.nn.Linear(64, 8), torch.nn.GroupNorm(2, 8), torch.nn.Linear(8, 10)
    )
    with pytest.raises(InvalidParameterError, match="ghost"):
        PriFedSync(model=norm_net, dataset=ds, grad_method="ghost")
    assert PriFedSync(model=norm_net, dataset=ds, batch_size=4).grad_method == "batched"


# -- acceptance (paper's Figure 1, on digits) --------------------------------------
def test_personalised_models_beat_the_global_model_on_label_shards():
    # 50 clients with 2 label shards each (1-3 labels): the personalised helper
    # models (alpha = 0.1) beat the global model on the clients' own test
    # records, as in the paper's Figure 1.
    ds = _digits(num_clients=50, shards_per_client=2)
    alg = _algorithm(
        ds,
        model="mlp",
        batch_size=8,
        local_steps=4,
        learning_rate=0.01,
        optimizer="adam",
        interpolation_weight=0.1,
    )
    _run(alg, 40)
    m = alg.evaluate()
    assert m["personal_test_accuracy"] > m["global_test_accuracy"] + 0.2
