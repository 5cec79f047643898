"""The algorithm contract's cases, shared by its checks in process and on Ray.

:data:`SPECS` holds one small, fast configuration per registered algorithm;
:func:`contract_algorithm` and :func:`contract_trainer` build it as every
contract check does (``tests/sim/test_contract.py``, and the Ray executor's
checks in ``tests/integrations/test_ray.py``, whose cluster driver imports
this module by name).
"""

from __future__ import annotations

import numpy as np
import torch

from dpfl.accounting.ledger import PrivacyLedger
from dpfl.data import get_dataset
from dpfl.models import build_model
from dpfl.sim.algorithms import build_algorithm
from dpfl.sim.loop import Trainer

#: name -> (algorithm parameters, noise multiplier, model, float tolerance of
#: loop vs batched after ROUNDS rounds). Tolerances: float32 sums taken in
#: another order (a batched kernel sums a cohort at once) differ by ~1e-7
#: relative per step.
SPECS: dict[str, tuple[dict, float, str, float]] = {
    "dsgd-rp": (
        dict(participation_probability=0.5, record_probability=0.5, learning_rate=0.5),
        1.0,
        "mlp",
        1e-5,
    ),
    # Noisy Adam on a digits MLP: loop (clipped_grad_sum per client) and
    # batched (cross-client ghost kernel) differ by float32 rounding only
    # (measured 1.5e-8 after 5 rounds).
    "prifedsync": (
        dict(
            sync_probability=0.5,
            batch_size=8,
            local_steps=2,
            learning_rate=0.01,
            optimizer="adam",
        ),
        1.0,
        "mlp",
        1e-6,
    ),
    # 4 of 12 clients, 1 local epoch of batch-8 SGD: the batched cohort step
    # and the per-client loop differ by float32 rounding only (~1e-7 a step).
    "dp-fedavg": (
        dict(cohort_size=4, local_epochs=1, batch_size=8, learning_rate=0.1, clip=1.0),
        1.0,
        "mlp",
        1e-5,
    ),
    # DP-FedNova (normalised updates) with the FedAdam server optimiser, so an
    # optimiser with state is under contract too (exact resume of its moments):
    # float32 rounding only, as DP-FedAvg.
    "dp-fednova": (
        dict(
            cohort_size=4,
            local_epochs=1,
            batch_size=8,
            learning_rate=0.1,
            clip=0.1,
            server_optimizer={"name": "adam", "tau": 0.01},
            server_learning_rate=0.01,
        ),
        1.0,
        "mlp",
        1e-5,
    ),
    # Non-private FedAvg (σ = 0: no event; the guard and pricing tests skip it)
    # with FedProx's proximal local objective, so the objective is under
    # contract too: float32 rounding only.
    "fedavg": (
        dict(
            cohort_size=4,
            local_epochs=1,
            batch_size=8,
            local_learning_rate=0.1,
            local_objective={"name": "proximal", "mu": 0.5},
        ),
        0.0,
        "mlp",
        1e-5,
    ),
    # Local SGD of one client vs the cohort in one kernel: ~1e-7 per step,
    # E = 2 steps per round; each client's batches and noise from its own streams.
    "ms-pafl": (
        dict(checkin_probability=0.5, local_steps=2, batch_size=8, learning_rate=0.1),
        1.0,
        "logistic_regression",
        1e-5,
    ),
    # LOCKS: loop (one client) and batched (S1 stacked) run the same kernel with
    # each client's own streams; float32 sums in another order allow 1e-5 (equal
    # bit for bit on CPU in practice).
    "locks": (
        dict(
            first_stage_probability=0.5,
            second_stage_size=3,
            norm_noise_ratio=4.0,
            local_steps=2,
            batch_size=8,
            local_learning_rate=0.5,
            server_learning_rate=1.0,
        ),
        1.0,
        "logistic_regression",
        1e-5,
    ),
}
ROUNDS = 3
KEY = bytes(range(32))  # the secure-noise key of every contract run


def _dataset():
    return get_dataset("digits", num_clients=12, seed=0, flatten=True)


DATASET = _dataset()


def contract_algorithm(name, sigma=None, device="cpu"):
    params, default_sigma, model, _ = SPECS[name]
    torch.manual_seed(0)
    net = build_model(
        model, input_shape=DATASET.input_shape, num_classes=DATASET.num_classes
    )
    return build_algorithm(
        name,
        params,
        model=net,
        dataset=DATASET,
        noise_multiplier=default_sigma if sigma is None else sigma,
        device=device,
    )


def contract_trainer(name, execution="batched", budget=None, sigma=None, device="cpu"):
    ledger = PrivacyLedger(budget)
    return Trainer(
        contract_algorithm(name, sigma, device),
        ledger=ledger,
        seed=7,
        execution=execution,
        noise_key=KEY,
    )


def ledger_json(trainer):
    return [e.to_json() for e in trainer.ledger.entries]


def same_state(a, b):
    """Exact equality of nested states (tensors, arrays, containers, scalars)."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, np.ndarray):
        return np.array_equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same_state(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same_state(x, y) for x, y in zip(a, b))
    return a == b


NAMES = sorted(SPECS)
