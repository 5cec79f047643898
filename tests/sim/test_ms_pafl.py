"""MS-PAFL: events, the message path (only the public part leaves), aggregation."""

import dataclasses
import math

import numpy as np
import pytest
import torch
import yaml
from scipy import stats

from dpfl.accounting import checkin, checkin_global, gaussian
from dpfl.accounting import events as ev
from dpfl.accounting.accountant import Accountant
from dpfl.accounting.ledger import PrivacyLedger
from dpfl.data import get_dataset
from dpfl.errors import InvalidParameterError, NonFiniteUpdateError
from dpfl.experiments.presets import PRESET_DIR
from dpfl.models import build_model
from dpfl.sim.algorithms import make_params
from dpfl.sim.algorithms.base import DataStats
from dpfl.sim.algorithms.ms_pafl import MsPafl
from dpfl.sim.algorithms.ms_pafl_params import MsPaflParams
from dpfl.sim.algorithms.tasks import Task
from dpfl.sim.batches import draw_local_batches
from dpfl.sim.executors import LoopExecutor
from dpfl.sim.loop import Trainer
from dpfl.sim.randomness import client_streams
from dpfl.sim.sampling_checkin import CheckInSampler

KEY = bytes(range(32))  # one secure-noise key: the same run twice

PRESETS = PRESET_DIR


def _tabular(num_clients=20, dim=14, records=40):
    # Stand-in for Adult: FedProx Synthetic-IID with 14 features, binary labels.
    return get_dataset(
        "synthetic",
        num_clients=num_clients,
        alpha=0.0,
        beta=0.0,
        dim=dim,
        num_classes=2,
        records_per_client=records,
        iid=True,
        seed=0,
        test_records_per_client=10,
    )


def _params(**kw):
    params = dict(
        checkin_probability=0.5,
        clip=1.0,
        learning_rate=0.5,
        local_steps=3,
        batch_size=8,
    )
    params.update(kw)
    return MsPaflParams(**params)


def _algorithm(ds, seed=0, sigma=2.0, **kw):
    torch.manual_seed(seed)
    model = build_model(
        "logistic_regression", input_shape=ds.input_shape, num_classes=2
    )
    return MsPafl(_params(**kw), model=model, dataset=ds, noise_multiplier=sigma)


class Capture(LoopExecutor):
    """The loop executor, recording what the server receives each round."""

    def __init__(self):
        self.sent = []

    def run(self, algorithm, weights, tasks, streams):
        messages = super().run(algorithm, weights, tasks, streams)
        self.sent.append(([t.client for t in tasks], messages.vectors.clone()))
        return messages


# ----------------------------------------------------------------- events, ledger
def test_seeded_run_emits_one_checkin_event_per_round_and_sound_epsilon():
    ds = _tabular()
    alg = _algorithm(ds)
    ledger = PrivacyLedger(None)
    reports = Trainer(alg, ledger=ledger, seed=3, noise_key=KEY).run(4)

    assert ledger.rounds == 4
    # The check-in event prices its Gaussian under replace-one (sensitivity 2C).
    expected = ev.CheckIn(0.5, ev.Gaussian(2.0))
    assert MsPafl.round_event(alg.params, DataStats.of(ds), 2.0) == expected
    for rep, entry in zip(reports, ledger.entries):
        assert entry.event == expected
        assert entry.participants == tuple(int(k) for k in rep.participants)
    report = MsPafl.paper_report(alg.params, DataStats.of(ds), 2.0, ledger, 1e-5)
    n_max = report["sound"]["rounds_joined_max"]
    worst = report["sound"]["client"]
    assert (
        n_max
        == ledger.client_rounds(worst)
        == max(ledger.client_rounds(k) for k in range(ds.num_clients))
    )
    # The reported ε is the accountant's for the rounds the client joined ...
    acc = Accountant().compose(ev.Gaussian(2.0, sensitivity=2.0), n_max)
    assert report["sound"]["epsilon"] == pytest.approx(acc.epsilon(1e-5).upper)
    # ... and matches the exact GDP composition mu = (2C/σ) sqrt(N) (Dong-Roth-Su
    # Cor. 3.3, docs/analyses.md) to the accountant's 2% bracket.
    exact = gaussian.gdp_epsilon(1e-5, mu=math.sqrt(n_max))
    assert report["sound"]["epsilon"] == pytest.approx(exact, rel=0.02)
    assert report["sound"]["epsilon"] >= exact * (1 - 1e-9)  # an upper bound
    # Same seed, same run: bit-identical model and private parts.
    alg2 = _algorithm(ds)
    Trainer(alg2, ledger=PrivacyLedger(None), seed=3, noise_key=KEY).run(4)
    assert torch.equal(alg.weights, alg2.weights)
    assert torch.equal(alg.private_parts, alg2.private_parts)
    assert torch.equal(alg.joined, alg2.joined)


def test_paper_report_figures_equal_the_formulas():
    ds = _tabular(num_clients=40)
    stats_ = DataStats.of(ds)
    asked = _params(local_epsilon=2.0, local_delta=1e-5)
    sigma, resolved = MsPafl.resolve_noise(asked, stats_)
    assert resolved.local_epsilon is None
    alg = MsPafl(
        resolved,
        model=build_model(
            "logistic_regression", input_shape=ds.input_shape, num_classes=2
        ),
        dataset=ds,
        noise_multiplier=sigma,
    )
    ledger = PrivacyLedger(None)
    Trainer(alg, ledger=ledger, seed=0).run(3)
    rep = MsPafl.paper_report(asked, stats_, sigma, ledger, 1e-5)
    gamma = checkin.subsampling_ratio(
        batch_size=8, dataset_size=40, replacement=False, local_steps=3
    )
    # docs/analyses.md: a record is touched w.p. 1 - (1 - b/n)^E.
    assert rep["paper_central_round"]["gamma"] == pytest.approx(1 - (1 - 8 / 40) ** 3)
    eps_c, delta_c = checkin_global.central_round(
        epsilon=2.0, delta=1e-5, clients=40, probability=0.5, gamma=gamma, xi=0.5
    )
    assert rep["paper_central_round"]["epsilon"] == pytest.approx(eps_c, rel=1e-12)
    assert rep["paper_central_round"]["delta"] == pytest.approx(delta_c, rel=1e-12)
    eps_g, _ = checkin_global.global_total(
        eps_max=eps_c, delta_max=delta_c, rounds=3, delta_slack=1e-5
    )
    assert rep["paper_global_total"]["epsilon"] == pytest.approx(eps_g, rel=1e-12)
    local = checkin.local_total_moments(
        probability=0.5,
        rounds=3,
        gamma=gamma,
        noise_multiplier=sigma,
        clip=1.0,
        delta=1e-5,
    )
    assert rep["paper_local_total"]["epsilon"] == pytest.approx(local["epsilon"])
    # The paper's amplified ledger figure never exceeds the un-amplified
    # composition of every round (all clients, all rounds).
    full = Accountant().compose(ev.Gaussian(sigma, 2.0), 3)
    assert rep["paper_ledger"]["epsilon"] <= full.epsilon(1e-5).upper
    for key in ("paper_ledger", "paper_central_round", "paper_local_total"):
        assert "caveat" in rep[key]
    # The resolved parameters read the local ε back from σ (analytic Gaussian).
    again = MsPafl.paper_report(resolved, stats_, sigma, ledger, 1e-5)
    assert again["paper_central_round"]["local_epsilon"] == pytest.approx(2.0, rel=1e-6)
    assert again["paper_central_round"]["epsilon"] == pytest.approx(eps_c, rel=1e-5)


def test_noise_calibration_analytic_and_lemma1():
    stats_ = DataStats.of(_tabular())
    assert MsPafl.resolve_noise(_params(), stats_) is None
    z, resolved = MsPafl.resolve_noise(
        _params(local_epsilon=2.0, local_delta=1e-5), stats_
    )
    assert resolved == _params(local_delta=1e-5)
    # Balle-Wang analytic Gaussian with Δ = 2C: δ(2) at the calibrated σ is 1e-5.
    assert gaussian.delta_for_epsilon(2.0, noise_multiplier=z, sensitivity=2.0) <= 1e-5
    assert gaussian.delta_for_epsilon(
        2.0, noise_multiplier=z * (1 - 1e-6), sensitivity=2.0
    ) == pytest.approx(1e-5, rel=1e-4)
    # Lemma 1 (Dwork-Roth 3.22): σ = sqrt(2 ln(1.25/δ)) · 2C / ε, closed form;
    # the noise multiplier is σ / C.
    lem = _params(local_epsilon=0.5, local_delta=1e-5, calibration="lemma1", clip=0.5)
    z_lem, resolved = MsPafl.resolve_noise(lem, stats_)
    sigma = math.sqrt(2 * math.log(1.25e5)) * 2 * 0.5 / 0.5
    assert z_lem * 0.5 == pytest.approx(sigma, rel=1e-12)
    # Its local ε is read back exactly from σ.
    eps, dlt = MsPafl.local_guarantee(resolved, z_lem)
    assert (eps, dlt) == (pytest.approx(0.5, rel=1e-12), 1e-5)
    with pytest.raises(InvalidParameterError, match="epsilon"):
        _params(local_epsilon=2.0, calibration="lemma1")


def test_unresolved_local_epsilon_is_refused_by_the_constructor():
    with pytest.raises(InvalidParameterError, match="resolve_noise"):
        _algorithm(_tabular(), local_epsilon=1.0)


# ------------------------------------------------------------------ message path
@pytest.mark.slow  # .ci/run runs it (-m slow)
def test_only_the_public_part_leaves_a_client_and_carries_noise_of_std_sigma():
    ds = _tabular(num_clients=30, dim=60)
    z = 0.7
    noisy = _algorithm(ds, sigma=z, checkin_probability=0.7)
    quiet = _algorithm(ds, sigma=1e-12, checkin_probability=0.7)
    d_pub = noisy.split.num_public
    d_priv = noisy.split.num_private
    assert d_pub == d_priv == 61  # LR on 60 features, 2 classes: 122 parameters

    w_old = noisy.public_model
    server_private = noisy.split.private(noisy.weights).clone()
    cap_noisy, cap_quiet = Capture(), Capture()
    # one key: the same check-ins, batches and standard normals in both runs
    rep = Trainer(
        noisy, ledger=PrivacyLedger(None), seed=0, execution=cap_noisy, noise_key=KEY
    ).step()
    Trainer(
        quiet, ledger=PrivacyLedger(None), seed=0, execution=cap_quiet, noise_key=KEY
    ).step()
    clients = rep.participants

    # What leaves a client is d_pub-dimensional, one row per participant.
    (c_noisy, m_noisy), (c_quiet, m_quiet) = cap_noisy.sent[0], cap_quiet.sent[0]
    assert c_noisy == c_quiet == clients.tolist()
    assert m_noisy.shape == (len(clients), d_pub)
    # Same streams for check-in and batches, so the quiet run's messages are
    # the clipped public updates ū themselves (noise 1e-12): norms <= C.
    assert float(m_quiet.norm(dim=1).max()) <= 1.0 + 1e-6
    # The noise is N(0, (zC)^2 I): chi-square test on n = m·d_pub coordinates
    # (mean of squares 1 ± 5 sd, sd = sqrt(2/n)), and the mean (± 5 sd).
    noise = (m_noisy - m_quiet).double() / z
    n = noise.numel()
    assert n > 1000
    assert abs(float(noise.pow(2).mean()) - 1.0) < 5 * math.sqrt(2 / n)
    assert abs(float(noise.mean())) < 5 / math.sqrt(n)
    assert stats.kstest(noise.flatten().numpy(), "norm").pvalue > 1e-4

    # Aggregation never touches the private coordinates of the server model ...
    assert torch.equal(noisy.split.private(noisy.weights), server_private)
    # ... and the public part moved by the Horvitz-Thompson mean of the messages.
    expected = w_old + m_noisy.sum(0) / (ds.num_clients * 0.7)
    torch.testing.assert_close(noisy.public_model, expected, atol=1e-6, rtol=0)
    # Participants' private parts were trained and kept; the others never joined.
    assert np.array_equal(np.flatnonzero(noisy.joined.numpy()), clients)
    moved = (noisy.private_of(clients) != server_private).any(dim=1)
    assert bool(moved.all())


def test_client_step_and_batched_steps_agree_and_use_the_clients_own_streams():
    ds = _tabular()
    alg = _algorithm(ds, sigma=1.0)
    tasks = [Task(k, state=alg.held_state(k)) for k in (2, 5, 11)]
    streams = [client_streams(4, 1, t.client) for t in tasks]
    one = [alg.client_step(alg.weights, t, s) for t, s in zip(tasks, streams)]
    streams = [client_streams(4, 1, t.client) for t in tasks]
    batched = alg.client_steps(alg.weights, tasks, streams)
    torch.testing.assert_close(
        batched.vectors, torch.stack([m.vector for m in one]), atol=1e-5, rtol=0
    )
    # A client's message depends on its own streams only (not the cohort).
    alone = alg.client_steps(alg.weights, tasks[1:2], [client_streams(4, 1, 5)])
    torch.testing.assert_close(alone.vectors[0], one[1].vector, atol=1e-5, rtol=0)


def test_parameter_clipping_sends_clipped_public_parameters():
    ds = _tabular()
    alg = _algorithm(
        ds, sigma=1e-12, clip_mode="parameters", aggregation="model", clip=0.3
    )
    cap = Capture()
    Trainer(alg, ledger=PrivacyLedger(None), seed=1, execution=cap).step()
    _, sent = cap.sent[0]
    assert float(sent.norm(dim=1).max()) <= 0.3 + 1e-6
    # eq. 17 on models: w_pub = (1/K) Σ m_k / p.
    expected = sent.sum(0) / (ds.num_clients * 0.5)
    torch.testing.assert_close(alg.public_model, expected, atol=1e-6, rtol=0)


def test_horvitz_thompson_on_updates_is_unbiased_with_heterogeneous_p():
    # Monte Carlo over check-ins of aggregate(): E[w_pub'] = w_pub + mean_k ū_k.
    # Tolerance: 5 standard errors per coordinate (sample std / sqrt(trials)).
    ds = _tabular(num_clients=8, dim=2)
    p = (0.1, 0.3, 0.5, 0.9, 1.0, 0.2, 0.7, 0.4)
    alg = _algorithm(ds, checkin_probability=p)
    sampler = alg.sampler(alg.params, alg.stats)
    gen = torch.Generator().manual_seed(0)
    u = torch.randn(8, alg.split.num_public, generator=gen, dtype=torch.float64)
    w_pub = torch.zeros(alg.split.num_public, dtype=torch.float64)
    rng = np.random.default_rng(0)
    trials = 20000
    out = torch.empty(trials, alg.split.num_public, dtype=torch.float64)
    for t in range(trials):
        clients = sampler.sample(rng).clients
        out[t] = alg.aggregate(clients, u[clients], w_pub)
    se = out.std(0) / math.sqrt(trials)
    assert torch.all((out.mean(0) - u.mean(0)).abs() < 5 * se)


@pytest.mark.parametrize("probabilities", [0.3, (0.1, 0.3, 0.5, 0.9, 1.0, 0.2)])
def test_checkin_sampler_frequencies_and_event(probabilities):
    # The check-in frequencies are the p_k (5 s.e. of a binomial proportion).
    sampler = CheckInSampler(
        num_clients=6, probabilities=probabilities, client_sizes=np.full(6, 4)
    )
    p = sampler.probabilities
    rng = np.random.default_rng(2)
    counts = np.zeros(6)
    for _ in range(4000):
        sample = sampler.sample(rng)
        counts[sample.clients] += 1
        assert np.all(sample.counts() == 4)  # each brings its whole data
    assert np.all(np.abs(counts / 4000 - p) < 5 * np.sqrt(p * (1 - p) / 4000) + 1e-12)
    assert sampler.event(1.5) == ev.CheckIn(float(p.max()), ev.Gaussian(1.5))
    with pytest.raises(InvalidParameterError):
        CheckInSampler(
            num_clients=5, probabilities=(0.5, 0.5), client_sizes=np.ones(5, int)
        )


def test_local_batches_touch_a_record_with_the_subsampling_ratio():
    # docs/analyses.md: P(record touched in E steps) = 1-(1-b/n)^E (WOR),
    # 1-(1-1/n)^{bE} (WR). Monte Carlo, 5 standard errors.
    rng = np.random.default_rng(1)
    n, b, e, trials = 20, 5, 3, 20000
    for replacement in (False, True):
        pos, mask = draw_local_batches(
            rng, np.full(trials, n), batch_size=b, steps=e, replacement=replacement
        )
        assert pos.shape == (e, trials, b) and mask.min() == 1.0
        if not replacement:
            srt = np.sort(pos, axis=2)
            assert np.all(np.diff(srt, axis=2) > 0)  # distinct within a batch
        touched = (pos == 0).any(axis=2).any(axis=0).mean()
        gamma = checkin.subsampling_ratio(
            batch_size=b, dataset_size=n, replacement=replacement, local_steps=e
        )
        se = math.sqrt(gamma * (1 - gamma) / trials)
        assert abs(touched - gamma) < 5 * se
    # A client smaller than b (WOR) uses all its records, padded with mask 0.
    pos, mask = draw_local_batches(
        rng, np.array([3, 10]), batch_size=5, steps=1, replacement=False
    )
    assert mask[0, 0].tolist() == [1, 1, 1, 0, 0]
    assert sorted(pos[0, 0, :3].tolist()) == [0, 1, 2]


# ----------------------------------------------------------------- training, state
@pytest.mark.slow  # default run under 4 minutes; .ci/run runs it (-m slow)
def test_training_improves_personalised_accuracy_and_resumes_exactly():
    ds = _tabular(num_clients=30)
    alg = _algorithm(ds, sigma=1.0, learning_rate=0.5)
    before = alg.evaluate()["test_accuracy"]
    trainer = Trainer(alg, ledger=PrivacyLedger(None), seed=0, noise_key=KEY)
    trainer.run(8)
    state = trainer.state_dict()
    trainer.run(4)
    after = alg.evaluate()["test_accuracy"]
    # Synthetic-IID is linearly separable by construction; chance is ~0.5.
    assert after > max(before, 0.5) + 0.15

    other = _algorithm(ds, sigma=1.0, learning_rate=0.5, seed=5)
    ledger = PrivacyLedger(None)  # the ledger as saved with the checkpoint
    for entry in trainer.ledger.entries[:8]:  # its chain covers the model digests
        ledger.record(entry.event, participants=entry.participants, digest=entry.digest)
    resumed = Trainer(other, ledger=ledger, seed=0, noise_key=KEY)
    resumed.load_state_dict(state)
    resumed.run(4)
    assert torch.equal(other.weights, alg.weights)
    assert torch.equal(other.private_parts, alg.private_parts)


def test_a_rejected_round_changes_no_private_part():
    ds = _tabular()
    alg = _algorithm(ds)
    trainer = Trainer(alg, ledger=PrivacyLedger(None), seed=0)
    trainer.step()
    parts, joined = alg.private_parts.clone(), alg.joined.clone()
    with torch.no_grad():
        alg.weights[-1] = math.inf  # a public coordinate: every message breaks
    with pytest.raises(NonFiniteUpdateError):
        trainer.step()
    assert torch.equal(alg.private_parts, parts) and torch.equal(alg.joined, joined)
    assert trainer.ledger.rounds == 1


def test_non_private_baseline_and_validation():
    ds = _tabular()
    alg = _algorithm(ds, sigma=0.0)
    assert alg.event() is None
    Trainer(alg, ledger=PrivacyLedger(None), seed=0).run(1)
    for bad in (
        dict(checkin_probability=0.0),
        dict(clip=-1.0),
        dict(clip_mode="gradient"),
        dict(aggregation="mean"),
        dict(private_fraction=1.0),
        dict(batch_size=0),
        dict(xi=1.0),
        dict(calibration="exact"),
    ):
        with pytest.raises(InvalidParameterError):
            _params(**bad)
    # Per-client probabilities must name every client (checked against the data).
    with pytest.raises(InvalidParameterError, match="one per client"):
        _algorithm(ds, checkin_probability=[0.5, 0.5])
    with pytest.raises(InvalidParameterError):
        MsPafl.round_event(
            _params(checkin_probability=[0.5, 0.5]), DataStats.of(ds), 1.0
        )


def test_params_from_a_yaml_list_and_the_presets():
    p = make_params("ms-pafl", {"checkin_probability": [0.2, 0.4]})
    assert p.checkin_probability == (0.2, 0.4)
    assert dataclasses.asdict(p)["checkin_probability"] == (0.2, 0.4)
    for path in sorted(PRESETS.glob("ms-pafl-*.yaml")):
        cfg = yaml.safe_load(path.read_text())
        params = make_params(cfg["algorithm"]["name"], cfg["algorithm"]["params"])
        assert isinstance(params, MsPaflParams)


def test_paper_report_uses_the_heterogeneous_theorem_2():
    # Per-client check-in probabilities: the paper's central-round figure is
    # eq. 19 with the clients' own p_k (Σ p_j expected check-ins), for the
    # most exposed client, not eq. 20 at max p_k (which understates it).
    ds = _tabular(num_clients=40)
    probs = np.r_[np.full(20, 0.3), np.full(20, 0.9)]
    asked = _params(checkin_probability=probs, local_epsilon=2.0, local_delta=1e-5)
    sigma, resolved = MsPafl.resolve_noise(asked, DataStats.of(ds))
    alg = _algorithm(
        ds,
        sigma=sigma,
        **{f.name: getattr(resolved, f.name) for f in dataclasses.fields(resolved)},
    )
    ledger = PrivacyLedger(None)
    Trainer(alg, ledger=ledger, seed=0).run(2)
    rep = MsPafl.paper_report(asked, DataStats.of(ds), sigma, ledger, 1e-5)
    rep = rep["paper_central_round"]
    gamma = rep["gamma"]
    eps_c, delta_c = checkin_global.central_round_clients(
        epsilon=2.0, delta=1e-5, probabilities=probs, gammas=gamma, xi=0.5
    )
    assert rep["epsilon"] == pytest.approx(eps_c.max(), rel=1e-12)
    assert rep["delta"] == pytest.approx(delta_c.max(), rel=1e-12)
    at_max, _ = checkin_global.central_round(
        epsilon=2.0, delta=1e-5, clients=40, probability=0.9, gamma=gamma, xi=0.5
    )
    assert rep["epsilon"] > at_max
