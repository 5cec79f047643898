"""Server optimisers (Reddi et al. 2021, Algorithm 2).

Each optimiser's direction is checked against an independent float64 numpy
transcription of the paper's update rules; the guarantee is checked to be the
same whichever optimiser steps (they post-process the released average).
"""

import numpy as np
import pytest
import torch

from dpfl.accounting.ledger import PrivacyLedger
from dpfl.data import get_dataset
from dpfl.errors import InvalidParameterError, NonFiniteUpdateError
from dpfl.models import build_model
from dpfl.sim.algorithms import build_algorithm, make_params
from dpfl.sim.loop import Trainer
from dpfl.sim.server_opt import check_server_optimizer, make_server_optimizer

KEY = bytes(range(32))
DATASET = get_dataset("digits", num_clients=12, seed=0, flatten=True)


def _reference(name, deltas, **o):
    """Reddi et al. (2021) Algorithm 2, float64, written out from the paper."""
    out, m, v, vel = [], 0.0, None, 0.0
    b1, b2, tau = o.get("beta1", 0.9), o.get("beta2", 0.99), o.get("tau", 1e-3)
    if name == "adagrad":
        b1 = o.get("beta1", 0.0)
    for d in deltas:
        if name == "sgd":
            out.append(d)
            continue
        if name == "momentum":
            vel = o.get("momentum", 0.9) * vel + d
            out.append(vel)
            continue
        v = np.full_like(d, tau * tau) if v is None else v
        m = b1 * m + (1 - b1) * d
        if name == "adagrad":
            v = v + d * d
        elif name == "adam":
            v = b2 * v + (1 - b2) * d * d
        else:  # yogi
            v = v - (1 - b2) * d * d * np.sign(v - d * d)
        out.append(m / (np.sqrt(v) + tau))
    return out


@pytest.mark.parametrize(
    "spec",
    [
        {"name": "sgd"},
        {"name": "momentum", "momentum": 0.5},
        {"name": "adagrad", "tau": 0.01},
        {"name": "adagrad", "beta1": 0.9, "tau": 0.1},
        {"name": "adam", "beta1": 0.8, "beta2": 0.9, "tau": 0.01},
        {"name": "yogi", "tau": 0.001},
    ],
)
def test_directions_follow_reddi_algorithm_2(spec):
    rng = np.random.default_rng(0)
    deltas = [rng.normal(size=7) * s for s in (1.0, 0.1, 3.0, 0.01)]
    opt = make_server_optimizer(spec)
    options = {k: v for k, v in spec.items() if k != "name"}
    want = _reference(spec["name"], deltas, **options)
    for d, w in zip(deltas, want):
        got = opt.direction(torch.tensor(d, dtype=torch.float64)).numpy()
        # float64 both sides, the same operations in another order: 1e-12.
        np.testing.assert_allclose(got, w, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        ({"name": "adamw"}, ["server_optimizer.name", "one of", "'adamw'"]),
        ({"name": "adam", "beta1": 1.0}, ["server_optimizer.beta1", "[0, 1)", "1.0"]),
        ({"name": "yogi", "beta2": -0.1}, ["server_optimizer.beta2", "[0, 1)", "-0.1"]),
        ({"name": "adam", "tau": 0}, ["server_optimizer.tau", "> 0", "0"]),
        ({"name": "momentum", "momentum": 1.5}, ["server_optimizer.momentum", "1.5"]),
        ({"name": "adagrad", "beta2": 0.9}, ["adagrad", "beta2", "takes"]),
        ("adam", ["server_optimizer must be a mapping", "'adam'"]),
        # found by the fuzz harness: a list as the name raised a TypeError
        ({"name": [], "momentum": 0.5}, ["server_optimizer.name", "one of", "[]"]),
    ],
)
def test_bad_options_are_refused_with_name_constraint_and_value(spec, words):
    with pytest.raises(InvalidParameterError) as err:
        make_params("dp-fedavg", {"server_optimizer": spec})
    for word in words:
        assert word in str(err.value)


def test_defaults_are_filled_in_the_params():
    p = make_params("fedavg", {"server_optimizer": {"name": "adam"}})
    assert p.server_optimizer == {
        "name": "adam",
        "beta1": 0.9,
        "beta2": 0.99,
        "tau": 1e-3,
    }
    assert check_server_optimizer(None) == {"name": "sgd"}


def _trainer(name, params, sigma=1.0):
    torch.manual_seed(0)
    net = build_model(
        "mlp", input_shape=DATASET.input_shape, num_classes=DATASET.num_classes
    )
    alg = build_algorithm(
        name, params, model=net, dataset=DATASET, noise_multiplier=sigma
    )
    return Trainer(alg, ledger=PrivacyLedger(None), seed=7, noise_key=KEY)


BASE = dict(cohort_size=4, local_epochs=1, batch_size=8, clip=1.0)


@pytest.mark.parametrize("clipping", ["fixed", "adaptive"])
def test_the_ledger_is_the_same_whichever_optimiser_steps(clipping):
    """Post-processing: same events and charges, different models."""
    base = dict(BASE, clipping=clipping, count_noise_multiplier=2.0)
    ledgers, weights = {}, {}
    for name in ("sgd", "momentum", "adam", "yogi", "adagrad"):
        params = dict(base, server_optimizer={"name": name})
        tr = _trainer("dp-fedavg", params)
        tr.run(3)
        ledgers[name] = [e.to_json() for e in tr.ledger.entries]
        weights[name] = tr.algorithm.weights.clone()
    assert len(ledgers["sgd"]) == 3
    for name in ledgers:
        assert ledgers[name] == ledgers["sgd"], name
        if name != "sgd":  # the optimiser did step differently
            assert not torch.equal(weights[name], weights["sgd"]), name


def test_explicit_sgd_is_the_default_bit_for_bit():
    a = _trainer("dp-fedavg", dict(BASE, server_learning_rate=0.7))
    b = _trainer(
        "dp-fedavg",
        dict(BASE, server_learning_rate=0.7, server_optimizer={"name": "sgd"}),
    )
    a.run(2)
    b.run(2)
    assert torch.equal(a.algorithm.weights, b.algorithm.weights)


def test_a_non_finite_average_leaves_the_optimiser_state_unchanged():
    tr = _trainer("fedavg", dict(cohort_size=4, server_optimizer={"name": "adam"}), 0)
    tr.run(1)
    alg = tr.algorithm
    before = {k: v.clone() for k, v in alg.server_optimizer.state.items()}
    w = alg.weights.clone()
    bad = torch.full_like(alg.weights, float("nan"))
    with pytest.raises(NonFiniteUpdateError):
        alg.server_update(bad, learning_rate=1.0)
    assert torch.equal(alg.weights, w)
    for k, v in before.items():
        assert torch.equal(alg.server_optimizer.state[k], v)


def test_optimiser_state_resumes_exactly(tmp_path):
    params = dict(BASE, server_optimizer={"name": "yogi", "tau": 0.01})
    whole = _trainer("dp-fedavg", params)
    whole.run(3)
    first = _trainer("dp-fedavg", params)
    first.run(2)
    torch.save(first.state_dict(), tmp_path / "ckpt.pt")
    first.ledger.save(tmp_path / "ledger.json")
    state = torch.load(tmp_path / "ckpt.pt", weights_only=True)
    assert set(state["algorithm"]["server_optimizer"]) == {"m", "v"}
    resumed = _trainer("dp-fedavg", params)
    resumed.ledger = PrivacyLedger.load(tmp_path / "ledger.json")
    resumed.load_state_dict(state)
    resumed.run(1)
    assert torch.equal(whole.algorithm.weights, resumed.algorithm.weights)
