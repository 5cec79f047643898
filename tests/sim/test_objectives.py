"""Local objectives: the registry, FedProx's proximal term, and FedAvg using it."""

import numpy as np
import pytest
import torch
from torch import nn

from dpfl.errors import InvalidParameterError
from dpfl.experiments.config import config_from_dict
from dpfl.sim.local import client_local_sgd, epoch_orders
from dpfl.sim.objectives import OBJECTIVES, Erm, make_objective
from dpfl.sim.objectives.proximal import Proximal


def test_registry_and_errors():
    assert {"erm", "proximal"} <= set(OBJECTIVES)
    assert make_objective(None) == Erm() == make_objective("erm")
    assert make_objective({"name": "proximal", "mu": 0.2}) == Proximal(mu=0.2)
    with pytest.raises(InvalidParameterError, match="one of"):
        make_objective({"name": "ridge"})
    with pytest.raises(InvalidParameterError, match=r"\['nu'\]"):
        make_objective({"name": "proximal", "nu": 1})
    with pytest.raises(InvalidParameterError, match="mu"):
        make_objective({"name": "proximal", "mu": -1})


def test_proximal_local_sgd_matches_a_hand_written_loop():
    # Reference: plain torch, θ ← θ − lr (∇ mean loss + μ (θ − θ_0)), batches in
    # the order epoch_orders draws from the same generator. Tolerance: float32
    # rounding (1e-6).
    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    x = torch.randn(13, 3)
    y = torch.randint(0, 2, (13,))
    start = {k: v.detach().clone() for k, v in model.named_parameters()}
    mu, lr, batch = 0.7, 0.1, 4
    got = client_local_sgd(
        model,
        start,
        x,
        y,
        rng=np.random.default_rng(5),
        epochs=2,
        batch_size=batch,
        learning_rate=lr,
        objective=Proximal(mu=mu),
    )
    ref = nn.Linear(3, 2)
    ref.load_state_dict(start)
    for order in epoch_orders(np.random.default_rng(5), 13, 2):
        for i in range(0, 13, batch):
            idx = torch.as_tensor(order[i : i + batch])
            ref.zero_grad()
            nn.functional.cross_entropy(ref(x[idx]), y[idx]).backward()
            with torch.no_grad():
                for k, p in ref.named_parameters():
                    p -= lr * (p.grad + mu * (p - start[k]))
    for k, p in ref.named_parameters():
        torch.testing.assert_close(got[k], p.detach(), atol=1e-6, rtol=0)
    # The term pulls towards the start: without it the model moves further.
    plain = client_local_sgd(
        model,
        start,
        x,
        y,
        rng=np.random.default_rng(5),
        epochs=2,
        batch_size=batch,
        learning_rate=lr,
    )

    def dist(w):
        return sum(float((w[k] - start[k]).norm() ** 2) for k in start)

    assert dist(got) < dist(plain)


def test_local_objective_is_a_config_option():
    cfg = config_from_dict(
        {
            "algorithm": {"name": "fedavg", "params": {"cohort_size": 5}},
            "privacy": {"epsilon": float("inf"), "noise_multiplier": 0.0},
        },
        ["algorithm.params.local_objective={name: proximal, mu: 0.05}"],
    )
    assert cfg.algorithm.params.local_objective == {"name": "proximal", "mu": 0.05}
    with pytest.raises(InvalidParameterError, match="local_objective"):
        config_from_dict(
            {
                "algorithm": {
                    "name": "dp-fedavg",
                    "params": {"local_objective": {"name": "x"}},
                }
            }
        )
