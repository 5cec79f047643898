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

from contract_cases import (  # noqa: E402
    DATASET,
    KEY,
    NAMES,
    ROUNDS,
    SPECS,
    contract_algorithm,
    contract_trainer,
    ledger_json,
    same_state,
)
from dpfl.accounting.accountant import Accountant
from dpfl.accounting.ledger import Budget, PrivacyLedger
from dpfl.errors import BudgetExceededError, NonFiniteUpdateError
from dpfl.sim.algorithms import ALGORITHMS
from dpfl.sim.algorithms.base import DataStats, Messages
from dpfl.sim.executors import shares
from dpfl.sim.loop import Trainer
from dpfl.sim.randomness import CohortStreams, server_streams

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.fixture(params=["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, CUDA])])
def device(request):
    """The device of a contract check: the CPU, and CUDA when present."""
    return request.param


def _private(name):
    if SPECS[name][1] == 0.0:
        pytest.skip(f"{name} is not private: no event to guard or price")


def test_every_registered_algorithm_is_under_contract():
    assert sorted(ALGORITHMS) == NAMES


@pytest.mark.parametrize("name", NAMES)
def test_seeded_runs_are_identical(name, device):
    a, b = contract_trainer(name, device=device), contract_trainer(name, device=device)
    a.run(ROUNDS)
    b.run(ROUNDS)
    assert torch.equal(a.algorithm.weights, b.algorithm.weights)
    assert ledger_json(a) == ledger_json(b)


@pytest.mark.parametrize(
    "name",
    # the non-private baseline's case with -m slow (.ci/run runs it)
    [pytest.param(n, marks=pytest.mark.slow) if n == "fedavg" else n for n in NAMES],
)
def test_loop_and_batched_executors_agree(name, device):
    atol = SPECS[name][3]
    loop = contract_trainer(name, "loop", device=device)
    batched = contract_trainer(name, "batched", device=device)
    for _ in range(ROUNDS):
        ra, rb = loop.step(), batched.step()
        np.testing.assert_array_equal(ra.participants, rb.participants)
    torch.testing.assert_close(
        loop.algorithm.weights, batched.algorithm.weights, atol=atol, rtol=0
    )
    assert ledger_json(loop) == ledger_json(batched)
    assert not torch.equal(
        loop.algorithm.weights, contract_algorithm(name, None, device).weights
    )


@pytest.mark.parametrize("name", NAMES)
def test_resume_is_exact(name, tmp_path, device):
    whole = contract_trainer(name, device=device)
    whole.run(ROUNDS)
    first = contract_trainer(name, device=device)
    first.run(1)
    torch.save(first.state_dict(), tmp_path / "ckpt.pt")
    first.ledger.save(tmp_path / "ledger.json")
    resumed = contract_trainer(name, device=device)
    resumed.ledger = PrivacyLedger.load(tmp_path / "ledger.json")
    state = torch.load(tmp_path / "ckpt.pt", map_location=device, weights_only=True)
    resumed.load_state_dict(state)
    resumed.run(ROUNDS - 1)
    assert torch.equal(whole.algorithm.weights, resumed.algorithm.weights)
    assert same_state(whole.algorithm.state_dict(), resumed.algorithm.state_dict())
    assert ledger_json(whole) == ledger_json(resumed)


@pytest.mark.parametrize("name", NAMES)
def test_budget_guard_refuses_before_any_work(name, device):
    _private(name)
    # A budget far below one round's cost (every scheme here costs > 0.01).
    trainer = contract_trainer(name, budget=Budget(0.01, 1e-5), device=device)
    before = trainer.algorithm.state_dict()
    with pytest.raises(BudgetExceededError):
        trainer.step()
    after = trainer.algorithm.state_dict()
    assert trainer.round == 0 and trainer.ledger.rounds == 0
    assert same_state(before, after)


@pytest.mark.parametrize("name", NAMES)
def test_non_finite_updates_are_rejected_and_not_charged(name, device):
    trainer = contract_trainer(name, device=device)
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
    trainer = contract_trainer(name, device=device)
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
    trainer = contract_trainer(name, sigma=0.0, device=device)
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
    trainer = contract_trainer(name, device=device)
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
    assert same_state(mine.scalars, theirs.scalars)
    assert same_state(mine.states, theirs.states)


# Three shares (an uneven split) with -m slow; one and two in the default run.
@pytest.mark.parametrize("workers", [1, 2, pytest.param(3, marks=pytest.mark.slow)])
@pytest.mark.parametrize("name", NAMES)
def test_a_cohort_split_over_replicas_gives_the_in_process_run(name, workers, device):
    atol = SPECS[name][3]
    local = contract_trainer(name, device=device)
    split = Trainer(
        contract_algorithm(name, None, device),
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
    assert ledger_json(split) == ledger_json(local)
