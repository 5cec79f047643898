"""PriFedSync: ledger events, paper report, helper models, noise convention, Adam."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import yaml
from scipy import special, stats

from dpfl.accounting import events as ev
from dpfl.accounting import subsampled
from dpfl.accounting.accountant import Accountant
from dpfl.accounting.ledger import PrivacyLedger
from dpfl.data import get_dataset
from dpfl.errors import InvalidParameterError
from dpfl.experiments.presets import PRESET_DIR
from dpfl.models import build_model
from dpfl.sim.algorithms import build_algorithm, make_params
from dpfl.sim.algorithms.base import DataStats
from dpfl.sim.algorithms.prifedsync import PriFedSync, PriFedSyncParams
from dpfl.sim.algorithms.tasks import Task
from dpfl.sim.loop import Trainer
from dpfl.sim.randomness import client_streams
from dpfl.sim.sampling_checkin import SyncSampler

DELTA = 1e-5
PRESETS = PRESET_DIR


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


DS = _digits()


def _algorithm(ds=DS, seed=0, model="logistic_regression", sigma=1.0, **kw):
    torch.manual_seed(seed)
    net = build_model(model, input_shape=ds.input_shape, num_classes=ds.num_classes)
    params = dict(sync_probability=0.5, batch_size=4, local_steps=3, learning_rate=0.05)
    params.update(kw)
    return build_algorithm(
        "prifedsync", params, model=net, dataset=ds, noise_multiplier=sigma
    )


def _run(alg, rounds, seed=0, execution="batched"):
    trainer = Trainer(
        alg,
        ledger=PrivacyLedger(None),
        seed=seed,
        execution=execution,
        secure_noise=False,
    )
    reports = trainer.run(rounds)
    return trainer.ledger, reports


# -- runs and the ledger ---------------------------------------------------------
def test_short_seeded_run_records_one_event_per_round_with_synced_clients():
    alg = _algorithm()
    assert isinstance(alg, PriFedSync)
    ledger, reports = _run(alg, 4)
    # A client syncs w.p. p' = p / (1 - (1-p)^m) (Ω is re-drawn while empty),
    # visibly, then runs K noisy steps on uniform batches (replace-one, so the
    # noise std 2Cσ faces sensitivity 2C: the WOR event doubles it).
    p, m = 0.5, DS.num_clients
    expected = ev.CheckIn(
        p / (1 - (1 - p) ** m),
        ev.SelfComposed(
            ev.WithoutReplacement(4, int(DS.client_sizes().min()), ev.Gaussian(2.0)),
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


def test_round_event_is_pure_and_sigma_is_the_papers():
    params = PriFedSyncParams(sync_probability=1.0, batch_size=4, local_steps=3)
    stats_ = DataStats.of(DS)
    event = PriFedSync.round_event(params, stats_, 0.7)
    n = int(DS.client_sizes().min())
    # p = 1: every client syncs every round (p' = 1, no log1p(-1) error).
    assert event == ev.CheckIn(
        1.0, ev.SelfComposed(ev.WithoutReplacement(4, n, ev.Gaussian(1.4)), 3)
    )
    assert event == SyncSampler(
        num_clients=DS.num_clients,
        sync_probability=1.0,
        client_sizes=DS.client_sizes(),
        batch_size=4,
        local_steps=3,
    ).event(1.4)


@pytest.mark.slow  # default run under 4 minutes; .ci/run runs it (-m slow)
def test_same_seed_same_models_and_different_seed_differs():
    a, b, c = _algorithm(), _algorithm(), _algorithm()
    _run(a, 3, seed=7)
    _run(b, 3, seed=7)
    _run(c, 3, seed=8)
    assert torch.equal(a.weights, b.weights)
    assert torch.equal(a.helpers, b.helpers)
    assert torch.equal(a.adam_steps, b.adam_steps)
    assert not torch.equal(a.weights, c.weights)


def test_non_private_run_charges_nothing():
    alg = _algorithm(sigma=0.0, clip=None)
    ledger, reports = _run(alg, 2)
    assert alg.event() is None
    assert ledger.rounds == 0
    assert all(r.event is None for r in reports)
    assert PriFedSync.paper_report(alg.params, alg.stats, 0.0, ledger, DELTA) is None


def test_paper_report_equals_the_accountants_and_the_exact_fdp_value():
    # p = 0.5, so clients sync a different number of rounds.
    alg = _algorithm(batch_size=4, local_steps=3)
    ledger, _ = _run(alg, 6)
    counts = np.zeros(DS.num_clients, int)
    for entry in ledger.entries:
        counts[list(entry.participants)] += 1
    r_max = int(counts.max())
    summary = PriFedSync.paper_report(alg.params, alg.stats, 1.0, ledger, DELTA)
    # The same computation as the accountant's at the ledger's tolerance, exactly.
    acc = (
        Accountant(tolerance=ledger.tolerance)
        .compose(alg.event().event, count=r_max)
        .epsilon(DELTA)
    )
    assert summary["epsilon"] == acc.upper
    assert summary["max_client_rounds"] == r_max
    assert summary["rounds"] == 6
    # The least-private client is the max over clients of client_epsilon.
    fewest = int(np.argmin(counts))
    if counts[fewest] < r_max:
        assert ledger.client_epsilon(fewest, DELTA).upper < summary["epsilon"]
    # Independent witness: subsampled.exact_epsilon composes C_{B/n}(G_{1/sigma}) for
    # K*R_max steps on its own grid (h = 1e-3); the accountant refines until
    # its bracket is within 2% (docs/analyses.md), so they agree to 3%.
    n = int(DS.client_sizes().min())
    exact = subsampled.exact_epsilon(
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
    assert weak.values["num_clients"] == DS.num_clients
    assert summary["strong"].values["epsilon"] == weak.values["epsilon"]
    # CLT mu, closed form of Theorem 2 / App. D (docs/analyses.md), to 1e-12:
    # mu = sqrt(2) (B/n) sqrt(K R) sqrt(e^{1/s^2} Phi(1.5/s) + 3 Phi(-0.5/s) - 2).
    h = math.e * special.ndtr(1.5) + 3 * special.ndtr(-0.5) - 2
    mu = math.sqrt(2) * (4 / n) * math.sqrt(3 * r_max) * math.sqrt(h)
    assert summary["mu_clt"] == pytest.approx(mu, rel=1e-12)
    mu_all = math.sqrt(2) * (4 / n) * math.sqrt(3 * 6) * math.sqrt(h)
    assert summary["mu_clt_all_rounds"] == pytest.approx(mu_all, rel=1e-12)
    assert summary["strong_mu_paper"] == pytest.approx(
        math.sqrt(DS.num_clients - 1) * mu, rel=1e-12
    )


def test_paper_report_needs_a_round():
    alg = _algorithm()
    with pytest.raises(InvalidParameterError, match="no round"):
        PriFedSync.paper_report(alg.params, alg.stats, 1.0, PrivacyLedger(None), DELTA)


# -- helper models ---------------------------------------------------------------
def _one_round(**kw):
    alg = _algorithm(**kw)
    _, reports = _run(alg, 1, seed=3)
    return alg, reports[0].participants


def test_interpolation_weight_one_gives_global_and_zero_keeps_local():
    one, clients = _one_round(interpolation_weight=1.0)
    zero, clients0 = _one_round(interpolation_weight=0.0)
    mid, clients_mid = _one_round(interpolation_weight=0.3)
    # Same seeds -> same Ω and the same trained models (training starts at w0).
    assert np.array_equal(clients, clients0) and np.array_equal(clients, clients_mid)
    assert torch.equal(one.weights, zero.weights)
    g = one.weights
    for k in clients.tolist():
        # alpha = 1: the helper is the global model.
        assert torch.allclose(one.helpers[k], g, atol=1e-6)
        # alpha = 0: the helper is the client's trained model, not the global.
        assert not torch.allclose(zero.helpers[k], g, atol=1e-4)
        # eq. (2.1): (1 - a) w^(i) + a w_global, to float32 rounding.
        expected = 0.7 * zero.helpers[k] + 0.3 * g
        assert torch.allclose(mid.helpers[k], expected, atol=1e-6)
    # eta = 1: the global model is the mean of the trained local models.
    trained = zero.helpers[torch.as_tensor(clients)]
    assert torch.allclose(g, trained.mean(0), atol=1e-6)
    # Clients that did not sync keep w0 and fresh optimiser states.
    w0 = _algorithm().weights
    others = sorted(set(range(DS.num_clients)) - set(clients.tolist()))
    assert others
    for k in others:
        assert torch.equal(zero.helpers[k], w0)
        assert int(zero.adam_steps[k]) == 0
    assert all(int(zero.adam_steps[k]) == 3 for k in clients.tolist())


def test_per_client_interpolation_weights():
    alphas = tuple(np.linspace(0.0, 1.0, DS.num_clients).tolist())
    per, clients = _one_round(interpolation_weight=alphas)
    zero, _ = _one_round(interpolation_weight=0.0)
    for k in clients.tolist():
        expected = (1 - alphas[k]) * zero.helpers[k] + alphas[k] * per.weights
        assert torch.allclose(per.helpers[k], expected, atol=1e-6)


def test_identity_helper_and_aggregation_rate():
    ident, clients = _one_round(helper="identity", aggregation_rate=0.5)
    zero, _ = _one_round(interpolation_weight=0.0)
    w0 = _algorithm().weights
    trained = zero.helpers[torch.as_tensor(clients)]
    # w_global = (1 - eta) w0 + eta * mean(trained), eta = 0.5.
    expected = 0.5 * w0 + 0.5 * trained.mean(0)
    assert torch.allclose(ident.weights, expected, atol=1e-6)
    for k in clients.tolist():
        assert torch.equal(ident.helpers[k], ident.weights)


def test_personal_equals_global_before_training():
    m = _algorithm().evaluate()
    assert m["personal_test_accuracy"] == m["global_test_accuracy"]
    assert m["test_loss"] == pytest.approx(m["global_test_loss"], rel=1e-12)


# -- noise convention and batches -------------------------------------------------
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
    # 3 clients, B = 5, sigma = 0.7, C = 0.5 -> std 2*C*sigma = 0.7.
    sigma, clip, b = 0.7, 0.5, 5
    alg = _algorithm(sigma=sigma, clip=clip, batch_size=b)
    data = [alg.client_data(alg.client_rows(k)) for k in range(3)]
    xb = torch.stack([x[:b] for x, _ in data])
    yb = torch.stack([y[:b] for _, y in data])
    theta = alg.weights[None, :].repeat(3, 1)
    reference = torch.stack(
        [
            alg.flatten(
                _clipped_sum_loop(
                    alg.model, alg.unflatten(theta[j]), xb[j], yb[j], clip
                )
            )
            for j in range(3)
        ]
    )
    gens = [torch.Generator().manual_seed(11 + j) for j in range(3)]
    # 4 draws x 3 clients x 650 coordinates = 7,800 noise values.
    noise = torch.cat(
        [
            (alg._noisy_mean(alg._grad_sums(theta, xb, yb), gens) * b - reference)
            .reshape(-1)
            .double()
            for _ in range(4)
        ]
    )
    # Chi-square test of the variance, two-sided, false-alarm rate 1e-6
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


def test_local_batches_are_uniform_subsets_without_replacement():
    sampler = SyncSampler(
        num_clients=2,
        sync_probability=1.0,
        client_sizes=np.array([5, 7]),
        batch_size=3,
        local_steps=4,
    )
    rng = np.random.default_rng(0)
    draws = 1000
    for n in (5, 7):
        hits = np.zeros(n)
        for _ in range(draws):
            pos = sampler.local_batches(rng, n)
            assert pos.shape == (4, 3)
            for row in pos:
                assert len(set(row.tolist())) == 3  # distinct
                assert row.max() < n
                hits[row] += 1
        # Each record is in a batch w.p. B/n; chi-square goodness of fit,
        # false-alarm rate 1e-6.
        expected = 4 * 3 * draws / n
        stat = float(((hits - expected) ** 2 / expected).sum())
        assert stat < stats.chi2.ppf(1 - 1e-6, n - 1)
    with pytest.raises(InvalidParameterError, match="client_size"):
        sampler.local_batches(rng, 2)


def test_sync_redraws_an_empty_cohort():
    sampler = SyncSampler(
        num_clients=3,
        sync_probability=0.05,
        client_sizes=np.array([5, 5, 5]),
        batch_size=2,
        local_steps=1,
    )
    rng = np.random.default_rng(1)
    assert all(sampler.sample(rng).num_clients >= 1 for _ in range(200))
    assert sampler.synced_probability == pytest.approx(0.05 / (1 - 0.95**3))


def test_clients_draw_from_their_own_streams():
    # A client's step depends on its own (seed, round, client) streams only,
    # not on which other clients run beside it.
    alg = _algorithm()
    w = alg.weights
    tasks = [Task(k, state=alg.held_state(k)) for k in (2, 5)]
    streams = [client_streams(9, 0, k) for k in (2, 5)]
    both = alg.client_steps(w, tasks, streams).vectors
    alone = alg.client_step(
        w, Task(5, state=alg.held_state(5)), client_streams(9, 0, 5)
    ).vector
    torch.testing.assert_close(both[1], alone, atol=1e-6, rtol=0)
    other = alg.client_step(
        w, Task(5, state=alg.held_state(5)), client_streams(9, 1, 5)
    ).vector
    assert not torch.allclose(other, alone)


# -- optimiser and kernels ---------------------------------------------------------
def test_local_adam_matches_torch_adam_client_by_client(monkeypatch):
    # PriFedSync's local Adam (dpfl.sim.local.cohort_adam_step on the stacked
    # synced clients, L2 penalty added to the gradient) equals torch.optim.Adam
    # (weight_decay) run client by client on the same gradients, with one
    # client's moments and step count carried over from an earlier sync
    # (atol 1e-6, float32). sigma = 0, so the gradient is the (patched) sum / B.
    b = 4
    alg = _algorithm(
        sigma=0.0, learning_rate=0.01, betas=(0.8, 0.95), weight_decay=0.1, batch_size=b
    )
    monkeypatch.setattr(
        alg, "_grad_sums", lambda theta, xb, yb: b * (torch.sin(3.0 * theta) + 0.1)
    )
    torch.manual_seed(1)
    d = alg.num_weights
    alg.helpers[4] = alg.weights + 0.1 * torch.randn(d)
    alg.exp_avg[4], alg.exp_avg_sq[4] = 0.01 * torch.randn(d), 1e-4 * torch.rand(d)
    alg.adam_steps[4] = 5
    clients = [1, 4]
    start = {k: alg.helpers[k].clone() for k in clients}
    moments = {k: (alg.exp_avg[k].clone(), alg.exp_avg_sq[k].clone()) for k in clients}
    streams = [client_streams(5, 0, k) for k in clients]
    sent = alg.client_steps(
        alg.weights, [Task(k, state=alg.held_state(k)) for k in clients], streams
    )
    theta = sent.vectors
    for row, k in enumerate(clients):
        param = torch.nn.Parameter(start[k])
        opt = torch.optim.Adam(
            [param], lr=0.01, betas=(0.8, 0.95), eps=1e-8, weight_decay=0.1
        )
        if k == 4:
            opt.state[param] = {
                "step": torch.tensor(5.0),
                "exp_avg": moments[k][0],
                "exp_avg_sq": moments[k][1],
            }
        for _ in range(alg.params.local_steps):
            param.grad = torch.sin(3.0 * param.detach()) + 0.1
            opt.step()
        torch.testing.assert_close(theta[row], param.detach(), atol=1e-6, rtol=0)
        m1, m2 = sent.states["exp_avg"][row], sent.states["exp_avg_sq"][row]
        steps = sent.states["steps"][row]
        torch.testing.assert_close(m1, opt.state[param]["exp_avg"], atol=1e-6, rtol=0)
        torch.testing.assert_close(
            m2, opt.state[param]["exp_avg_sq"], atol=1e-6, rtol=0
        )
        assert steps == int(opt.state[param]["step"])


@pytest.mark.slow  # default run under 4 minutes; .ci/run runs it (-m slow)
@pytest.mark.parametrize("model", ["logistic_regression", "mlp"])
def test_grad_methods_and_executors_agree(model):
    algs = [
        _algorithm(model=model, grad_method=g)
        for g in ("batched", "per-client", "ghost", "auto")
    ]
    assert algs[3].grad_method == "ghost"  # auto takes the cross-client ghost kernel
    for alg in algs:
        _run(alg, 1, seed=5)
    loop = _algorithm(model=model)
    _run(loop, 1, seed=5, execution="loop")
    # float32 sums in different orders: 1e-5 absolute.
    for alg in algs[1:] + [loop]:
        torch.testing.assert_close(algs[0].weights, alg.weights, atol=1e-5, rtol=0)
        torch.testing.assert_close(algs[0].helpers, alg.helpers, atol=1e-5, rtol=0)


def test_sgd_keeps_no_moments_and_state_round_trips():
    a = _algorithm(optimizer="sgd")
    assert a.exp_avg is None and a.exp_avg_sq is None
    _run(a, 2)
    b = _algorithm(optimizer="sgd", seed=4)
    b.load_state_dict(a.state_dict())
    assert torch.equal(a.weights, b.weights) and torch.equal(a.helpers, b.helpers)
    assert torch.equal(a.adam_steps, b.adam_steps)
    bad = a.state_dict()
    bad["extra"]["helpers"] = bad["extra"]["helpers"][:3]
    with pytest.raises(InvalidParameterError, match="helpers"):
        b.load_state_dict(bad)


def test_invalid_parameters_raise():
    with pytest.raises(InvalidParameterError, match="batch_size"):
        _algorithm(batch_size=10_000)
    with pytest.raises(InvalidParameterError, match="batch_size"):
        PriFedSync.round_event(PriFedSyncParams(batch_size=10_000), DataStats.of(DS), 1)
    with pytest.raises(InvalidParameterError, match="helper"):
        PriFedSyncParams(helper="median")
    with pytest.raises(InvalidParameterError, match="interpolation_weight"):
        PriFedSyncParams(interpolation_weight=1.5)
    with pytest.raises(InvalidParameterError, match="interpolation_weight"):
        _algorithm(interpolation_weight=[0.1, 0.2])
    with pytest.raises(InvalidParameterError, match="sync_probability"):
        PriFedSyncParams(sync_probability=0.0)
    with pytest.raises(InvalidParameterError, match="betas"):
        PriFedSyncParams(betas=(0.9, 1.0))
    with pytest.raises(InvalidParameterError, match="optimizer"):
        PriFedSyncParams(optimizer="rmsprop")
    with pytest.raises(InvalidParameterError, match="clip"):
        _algorithm(clip=None)
    with pytest.raises(InvalidParameterError, match="grad_method"):
        PriFedSyncParams(grad_method="fast")
    with pytest.raises(InvalidParameterError, match="noise_multiplier"):
        _algorithm(sigma=-1.0)
    norm_net = torch.nn.Sequential(
        torch.nn.Linear(64, 8), torch.nn.GroupNorm(2, 8), torch.nn.Linear(8, 10)
    )
    with pytest.raises(InvalidParameterError, match="ghost"):
        build_algorithm(
            "prifedsync", {"grad_method": "ghost"}, model=norm_net, dataset=DS
        )
    alg = build_algorithm("prifedsync", {"batch_size": 4}, model=norm_net, dataset=DS)
    assert alg.grad_method == "batched"


@pytest.mark.parametrize("path", sorted(PRESETS.glob("prifedsync-*.yaml")))
def test_presets_are_valid_parameters(path):
    config = yaml.safe_load(path.read_text())
    params = make_params("prifedsync", config["algorithm"]["params"])
    assert isinstance(params, PriFedSyncParams)
    assert params.to_dict()["sync_probability"] == 0.5


# -- acceptance (paper's Figure 1, on digits) --------------------------------------
@pytest.mark.slow  # .ci/run runs it (-m slow)
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


# -- learning-rate decay (the paper's CIFAR-10 schedule) ------------------------
def test_lr_decay_follows_each_clients_own_step_count_sgd():
    # lr * decay ** (t // every), t the client's local steps so far
    alg = _algorithm(optimizer="sgd", lr_decay=0.5, lr_decay_steps=2)
    theta = torch.zeros(3, 4, dtype=torch.float64)
    steps = torch.tensor([0, 2, 5])
    new = alg._local_update(theta, torch.ones_like(theta), None, None, steps)
    expected = -0.05 * torch.tensor([1.0, 0.5, 0.25], dtype=torch.float64)
    assert torch.allclose(new, expected[:, None].expand(3, 4))
    assert steps.tolist() == [1, 3, 6]


def test_lr_decay_matches_torch_adam_with_a_step_schedule():
    # independent reference: torch.optim.Adam whose lr is set before each step
    # to lr * 0.9 ** (t // 3) (Zheng et al.'s "x0.99 every 10 epochs", scaled)
    alg = _algorithm(optimizer="adam", lr_decay=0.9, lr_decay_steps=3)
    gen = torch.Generator().manual_seed(0)
    grads = [torch.randn(1, 5, generator=gen, dtype=torch.float64) for _ in range(8)]
    theta = torch.zeros(1, 5, dtype=torch.float64)
    m1, m2 = torch.zeros_like(theta), torch.zeros_like(theta)
    steps = torch.zeros(1, dtype=torch.long)
    ref = torch.zeros(5, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.Adam([ref], lr=0.05)
    for t, g in enumerate(grads):
        theta = alg._local_update(theta, g, m1, m2, steps)
        for group in opt.param_groups:
            group["lr"] = 0.05 * 0.9 ** (t // 3)
        ref.grad = g[0].clone()
        opt.step()
    assert torch.allclose(theta[0], ref.detach(), rtol=1e-10, atol=1e-12)
    # and without the decay the path differs
    plain = _algorithm(optimizer="adam")
    theta2 = torch.zeros(1, 5, dtype=torch.float64)
    z1, z2 = torch.zeros_like(theta2), torch.zeros_like(theta2)
    s2 = torch.zeros(1, dtype=torch.long)
    for g in grads:
        theta2 = plain._local_update(theta2, g, z1, z2, s2)
    assert not torch.allclose(theta2, theta)


def test_lr_decay_is_validated():
    with pytest.raises(InvalidParameterError, match="lr_decay"):
        PriFedSyncParams(lr_decay=1.5)
    with pytest.raises(InvalidParameterError, match="lr_decay_steps"):
        PriFedSyncParams(lr_decay_steps=0)
