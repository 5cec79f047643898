"""DP-FedNova: FedNova's normalised averaging (Wang et al. 2020) under DP-FedAvg."""

import numpy as np
import pytest
import torch

from dpfl.accounting.ledger import PrivacyLedger
from dpfl.data import get_dataset
from dpfl.models import build_model
from dpfl.sim.algorithms import build_algorithm
from dpfl.sim.algorithms.tasks import Task
from dpfl.sim.loop import Trainer
from dpfl.sim.randomness import client_streams

KEY = bytes(range(32))
DATASET = get_dataset("digits", num_clients=12, seed=0, flatten=True)
BASE = dict(cohort_size=4, local_epochs=2, batch_size=8, clip=1.0)


def _trainer(name, params, sigma=1.0):
    torch.manual_seed(0)
    net = build_model(
        "mlp", input_shape=DATASET.input_shape, num_classes=DATASET.num_classes
    )
    alg = build_algorithm(
        name, params, model=net, dataset=DATASET, noise_multiplier=sigma
    )
    return Trainer(alg, ledger=PrivacyLedger(None), seed=7, noise_key=KEY)


def test_dp_fednova_normalises_by_local_steps_and_keeps_dp_fedavgs_event():
    params = BASE
    nova = _trainer("dp-fednova", params)
    avg = _trainer("dp-fedavg", params)
    sizes = DATASET.client_sizes()
    # τ_k = E ⌈n_k / B⌉ (Wang et al. 2020 with local SGD), τ_eff their mean.
    want = np.array([2 * int(np.ceil(n / 8)) for n in sizes])
    np.testing.assert_array_equal(nova.algorithm.local_steps, want)
    assert nova.algorithm.effective_steps == pytest.approx(want.mean(), rel=1e-15)
    nova.run(2)
    avg.run(2)
    # The same sampler and Gaussian mechanism: identical charges.
    assert [e.to_json() for e in nova.ledger.entries] == [
        e.to_json() for e in avg.ledger.entries
    ]
    # A client's message is its update divided by its τ_k (no clipping here).
    alg = nova.algorithm
    w = alg.weights.clone()
    task = Task(3, options={"clip": 1e9})
    msg = alg.client_step(w, task, client_streams(0, 0, 3))
    ref, _ = avg.algorithm.local_sgd_update(
        w, task, client_streams(0, 0, 3), **alg._local()
    )
    torch.testing.assert_close(msg.vector, ref / float(want[3]), rtol=0, atol=0)


def test_dp_fednova_rescales_the_noisy_average_by_the_public_tau_eff():
    """The server's step is τ_eff times DP-FedAvg's for the same messages."""
    nova = _trainer("dp-fednova", BASE).algorithm
    w = nova.weights.clone()
    delta = torch.linspace(-1, 1, w.numel())
    nova.server_update(delta, learning_rate=0.5)
    want = w + 0.5 * (delta * nova.effective_steps)
    torch.testing.assert_close(nova.weights, want, rtol=1e-6, atol=1e-7)
