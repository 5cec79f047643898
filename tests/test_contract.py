"""The algorithm contract, checked for every registered algorithm on both executors.

For each algorithm (one small, fast configuration in :data:`SPECS`):

* determinism: the same seed and secure-noise key give the same weights and
  ledger;
* loop = batched: the one-client-at-a-time reference and the vectorised
  cohort give the same weights after several rounds (to ``atol`` in float32,
  stated per algorithm) and the same ledger exactly;
* exact resume: a run checkpointed and resumed equals the uninterrupted run;
* the budget guard refuses a round before any work (weights, state and
  ledger unchanged);
* a non-finite update is rejected (weights unchanged, ledger not charged);
* the realised event prices as the event checked before the round, and the
  event is the pure ``round_event`` of the parameters (no model needed);
* a non-private run (σ = 0) has no event and charges nothing;
* a replica built from the algorithm's blueprint (what a Ray worker holds)
  computes the same messages as the trained algorithm itself: client steps
  read mutable state only from their tasks; and a cohort cut into shares run
  on replicas gives the run of the in-process executor (the contract of every
  distributed executor).

Every check runs on each device present (the ``device`` fixture): the CPU
always, CUDA when there is one (marked ``gpu``: ``pytest -m gpu``; skipped,
with the reason, without CUDA). The secure noise is drawn on the device.
Without a GPU, :mod:`test_contract_lazy` (``-m slow``) runs the checks that
exercise every device path on torch's lazy tensors, a second device that
refuses to mix with the CPU as CUDA does.

:data:`SPECS` must name every registered algorithm: a new algorithm cannot be
registered without joining the contract.
"""

from __future__ import annotations

import math
import pickle

import numpy as np
import pytest
import torch

from dpfl.accounting.accountant import Accountant
from dpfl.accounting.ledger import Budget, PrivacyLedger
from dpfl.data import get_dataset
from dpfl.errors import BudgetExceededError, NonFiniteUpdateError
from dpfl.models import build_model
from dpfl.sim.algorithms import ALGORITHMS, build_algorithm
from dpfl.sim.algorithms.base import DataStats, Messages
from dpfl.sim.executors import shares
from dpfl.sim.loop import Trainer
from dpfl.sim.randomness import CohortStreams, server_streams

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


CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.fixture(params=["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, CUDA])])
def device(request):
    """The device of a contract check: the CPU, and CUDA when present."""
    return request.param


def _algorithm(name, sigma=None, device="cpu"):
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


def _trainer(name, execution="batched", budget=None, sigma=None, device="cpu"):
    ledger = PrivacyLedger(budget)
    return Trainer(
        _algorithm(name, sigma, device),
        ledger=ledger,
        seed=7,
        execution=execution,
        noise_key=KEY,
    )


def _private(name):
    if SPECS[name][1] == 0.0:
        pytest.skip(f"{name} is not private: no event to guard or price")


def _ledger_json(trainer):
    return [e.to_json() for e in trainer.ledger.entries]


def _same(a, b):
    """Exact equality of nested states (tensors, arrays, containers, scalars)."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, np.ndarray):
        return np.array_equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


NAMES = sorted(SPECS)


def test_every_registered_algorithm_is_under_contract():
    assert sorted(ALGORITHMS) == NAMES


@pytest.mark.parametrize("name", NAMES)
def test_seeded_runs_are_identical(name, device):
    a, b = _trainer(name, device=device), _trainer(name, device=device)
    a.run(ROUNDS)
    b.run(ROUNDS)
    assert torch.equal(a.algorithm.weights, b.algorithm.weights)
    assert _ledger_json(a) == _ledger_json(b)


@pytest.mark.parametrize(
    "name",
    # the non-private baseline's case with -m slow (.ci/run runs it)
    [pytest.param(n, marks=pytest.mark.slow) if n == "fedavg" else n for n in NAMES],
)
def test_loop_and_batched_executors_agree(name, device):
    atol = SPECS[name][3]
    loop = _trainer(name, "loop", device=device)
    batched = _trainer(name, "batched", device=device)
    for _ in range(ROUNDS):
        ra, rb = loop.step(), batched.step()
        np.testing.assert_array_equal(ra.participants, rb.participants)
    torch.testing.assert_close(
        loop.algorithm.weights, batched.algorithm.weights, atol=atol, rtol=0
    )
    assert _ledger_json(loop) == _ledger_json(batched)
    assert not torch.equal(
        loop.algorithm.weights, _algorithm(name, None, device).weights
    )


@pytest.mark.parametrize("name", NAMES)
def test_resume_is_exact(name, tmp_path, device):
    whole = _trainer(name, device=device)
    whole.run(ROUNDS)
    first = _trainer(name, device=device)
    first.run(1)
    torch.save(first.state_dict(), tmp_path / "ckpt.pt")
    first.ledger.save(tmp_path / "ledger.json")
    resumed = _trainer(name, device=device)
    resumed.ledger = PrivacyLedger.load(tmp_path / "ledger.json")
    state = torch.load(tmp_path / "ckpt.pt", map_location=device, weights_only=True)
    resumed.load_state_dict(state)
    resumed.run(ROUNDS - 1)
    assert torch.equal(whole.algorithm.weights, resumed.algorithm.weights)
    assert _same(whole.algorithm.state_dict(), resumed.algorithm.state_dict())
    assert _ledger_json(whole) == _ledger_json(resumed)


@pytest.mark.parametrize("name", NAMES)
def test_budget_guard_refuses_before_any_work(name, device):
    _private(name)
    # A budget far below one round's cost (every scheme here costs > 0.01).
    trainer = _trainer(name, budget=Budget(0.01, 1e-5), device=device)
    before = trainer.algorithm.state_dict()
    with pytest.raises(BudgetExceededError):
        trainer.step()
    after = trainer.algorithm.state_dict()
    assert trainer.round == 0 and trainer.ledger.rounds == 0
    assert _same(before, after)


@pytest.mark.parametrize("name", NAMES)
def test_non_finite_updates_are_rejected_and_not_charged(name, device):
    trainer = _trainer(name, device=device)
    with torch.no_grad():
        trainer.algorithm.weights[0] = math.nan
    before = trainer.algorithm.weights.clone()
    with pytest.raises(NonFiniteUpdateError):
        trainer.step()
    assert trainer.ledger.rounds == 0 and trainer.round == 0
    torch.testing.assert_close(trainer.algorithm.weights, before, equal_nan=True)


@pytest.mark.slow  # default run under 4 minutes; .ci/run runs it (-m slow)
@pytest.mark.parametrize("name", NAMES)
def test_realised_event_prices_as_the_pure_round_event(name, device):
    _private(name)
    trainer = _trainer(name, device=device)
    alg = trainer.algorithm
    cls = type(alg)
    params, sigma = SPECS[name][0], SPECS[name][1]
    pure = cls.round_event(alg.params, DataStats.of(DATASET), sigma)
    assert pure == alg.event()
    reports = trainer.run(ROUNDS)
    want = Accountant().compose(pure).epsilon(1e-5).upper
    for r in reports:
        assert Accountant().compose(r.event).epsilon(1e-5).upper == pytest.approx(
            want, rel=1e-9
        )
    assert trainer.ledger.rounds == ROUNDS
    del params


@pytest.mark.parametrize("name", NAMES)
def test_non_private_runs_are_not_charged(name, device):
    trainer = _trainer(name, sigma=0.0, device=device)
    assert trainer.algorithm.event() is None
    reports = trainer.run(2)
    assert all(r.event is None for r in reports)
    assert trainer.ledger.rounds == 0


class _ReplicaExecutor:
    """The distributed contract in one process: shares run on pickled replicas."""

    name = "replicas"

    def __init__(self, workers):
        self.workers = workers
        self.replicas = None

    def run(self, algorithm, weights, tasks, streams):
        if self.replicas is None:
            blob = pickle.dumps(algorithm.blueprint())
            self.replicas = [pickle.loads(blob).build() for _ in range(self.workers)]
        parts = [
            self.replicas[i].client_steps(
                weights.clone(),
                pickle.loads(pickle.dumps(tasks[a:b])),
                pickle.loads(pickle.dumps(streams.part(a, b))),
            )
            for i, (a, b) in enumerate(shares(len(tasks), self.workers))
        ]
        return (
            Messages.concat(parts)
            if parts
            else algorithm.client_steps(weights, tasks, streams)
        )


@pytest.mark.parametrize("name", NAMES)
def test_a_replica_computes_the_trained_algorithms_messages(name, device):
    trainer = _trainer(name, device=device)
    trainer.run(2)
    alg = trainer.algorithm
    replica = pickle.loads(pickle.dumps(alg.blueprint())).build()
    cohort = alg.select(2, server_streams(7, 2, device, key=KEY))
    clients = [t.client for t in cohort.tasks]
    streams = CohortStreams(7, 2, clients, device, key=KEY)
    mine = alg.client_steps(alg.weights, cohort.tasks, streams)
    theirs = replica.client_steps(
        alg.weights.clone(), cohort.tasks, pickle.loads(pickle.dumps(streams))
    )
    assert torch.equal(mine.vectors, theirs.vectors)
    assert _same(mine.scalars, theirs.scalars)
    assert _same(mine.states, theirs.states)


# Three shares (an uneven split) with -m slow; one and two in the default run.
@pytest.mark.parametrize("workers", [1, 2, pytest.param(3, marks=pytest.mark.slow)])
@pytest.mark.parametrize("name", NAMES)
def test_a_cohort_split_over_replicas_gives_the_in_process_run(name, workers, device):
    atol = SPECS[name][3]
    local = _trainer(name, device=device)
    split = Trainer(
        _algorithm(name, None, device),
        ledger=PrivacyLedger(None),
        seed=7,
        execution=_ReplicaExecutor(workers),
        noise_key=KEY,  # shares get the clients' derived keys (pickled)
    )
    local.run(ROUNDS)
    split.run(ROUNDS)
    torch.testing.assert_close(
        split.algorithm.weights, local.algorithm.weights, atol=atol, rtol=0
    )
    assert _ledger_json(split) == _ledger_json(local)
