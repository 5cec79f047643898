"""LOCKS with the stale norm: clients release the norm of their previous update.

The LOCKS paper's S1 clients "compute a private estimate of their last
gradient norm" (§6); ``norm_source="stale"`` releases the clipped norm of the
update the client computed the last time it was in S1 (its current one the
first time). Checked here: exact released values in non-private runs, the
same Gaussian noise as the current norm's, unchanged ledger events and
charges, and the engine contract (loop = batched, exact resume, replicas).
"""

from __future__ import annotations

import math
import pickle

import numpy as np
import pytest
import torch

from dpfl.accounting.ledger import PrivacyLedger
from dpfl.data import FederatedDataset, get_dataset
from dpfl.errors import InvalidParameterError
from dpfl.models import LogisticRegression, build_model
from dpfl.sim.algorithms import build_algorithm
from dpfl.sim.algorithms.locks import Locks
from dpfl.sim.algorithms.locks_params import LocksParams
from dpfl.sim.algorithms.tasks import Task
from dpfl.sim.loop import Trainer
from dpfl.sim.randomness import CohortStreams, client_streams, server_streams

KEY = bytes(range(32))  # one secure-noise key: the same run twice

SETTINGS = dict(
    first_stage_probability=0.5,
    second_stage_size=3,
    norm_noise_ratio=4.0,
    clip=1.0,
    local_steps=2,
    batch_size=8,
    local_learning_rate=0.5,
    server_learning_rate=1.0,
)
DIGITS = get_dataset("digits", num_clients=12, seed=0, flatten=True)


def _tiny_locks(sigma: float, norm_source: str, clip: float = 0.05) -> Locks:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(6, 2)).astype(np.float32)
    ds = FederatedDataset(
        features=x,
        labels=np.array([0, 1, 0, 1, 1, 0]),
        client_indices=[np.array([k]) for k in range(6)],
        num_classes=2,
    )
    torch.manual_seed(0)
    return Locks(
        LocksParams(**{**SETTINGS, "norm_source": norm_source, "clip": clip}),
        model=LogisticRegression(2, 2),
        dataset=ds,
        noise_multiplier=sigma,
    )


def _trainer(norm_source: str = "stale", execution: str = "batched") -> Trainer:
    torch.manual_seed(0)
    net = build_model(
        "logistic_regression",
        input_shape=DIGITS.input_shape,
        num_classes=DIGITS.num_classes,
    )
    alg = build_algorithm(
        "locks",
        {**SETTINGS, "norm_source": norm_source},
        model=net,
        dataset=DIGITS,
        noise_multiplier=1.0,
    )
    return Trainer(
        alg, ledger=PrivacyLedger(None), seed=7, execution=execution, noise_key=KEY
    )


def test_norm_source_is_validated() -> None:
    with pytest.raises(InvalidParameterError, match="norm_source"):
        LocksParams(norm_source="last")
    assert LocksParams().norm_source == "current"
    alg = _tiny_locks(1.0, "stale")
    with pytest.raises(InvalidParameterError, match="norm must be in"):
        alg.release(torch.zeros(alg.num_weights), torch.Generator(), 0.06)  # C = 0.05


def test_non_private_stale_release_is_the_held_norm_exactly() -> None:
    alg = _tiny_locks(0.0, "stale")
    w = alg.weights
    fresh = alg.client_step(
        w, Task(2, state={"last_norm": torch.tensor(-1.0)}), client_streams(0, 0, 2)
    )
    current = float(fresh.state["last_norm"])
    assert 0.0 < current <= 0.05  # ‖ḡ‖, capped at C
    # First time in S1 (-1 held): the current norm is released (ν = 5e-4).
    assert fresh.scalars["noisy_norm"] == pytest.approx(max(5e-4, current), abs=0)
    held = alg.client_step(
        w, Task(2, state={"last_norm": torch.tensor(0.03125)}), client_streams(0, 0, 2)
    )
    assert held.scalars["noisy_norm"] == 0.03125
    # The held state it sends back is this round's norm, not the stale one.
    assert float(held.state["last_norm"]) == current
    # Below the floor ν = 0.01 C the release is ν.
    low = alg.client_step(
        w, Task(2, state={"last_norm": torch.tensor(0.0)}), client_streams(0, 0, 2)
    )
    assert low.scalars["noisy_norm"] == pytest.approx(5e-4)


def test_stale_norm_gets_the_current_norms_gaussian_noise() -> None:
    # Same client streams: the same ξ is added to whichever norm is released,
    # with std σ_n C, and the update's noise z is the same draw too.
    cur = _tiny_locks(0.01, "current")
    sta = _tiny_locks(0.01, "stale")
    w = cur.weights
    a = cur.client_step(w, Task(3), client_streams(5, 1, 3))
    b = sta.client_step(
        w, Task(3, state={"last_norm": torch.tensor(0.02)}), client_streams(5, 1, 3)
    )
    norm = float(b.state["last_norm"])
    # σ_n C = 0.002: neither release is at the floor ν = 5e-4.
    assert min(a.scalars["noisy_norm"], b.scalars["noisy_norm"]) > 5e-4
    assert a.scalars["noisy_norm"] - norm == pytest.approx(
        b.scalars["noisy_norm"] - 0.02,
        abs=1e-8,  # float32 noise draws
    )
    assert a.scalars["noisy_norm"] != pytest.approx(norm, abs=1e-9)  # noise added
    assert torch.equal(a.vector, b.vector)
    # The noise is N(0, (σ_n C)^2) around the held norm: 4,000 draws, mean and
    # std within 5 standard errors (σ = 0.01: σ_n C = 0.002, so the floor
    # ν = 5e-4 is 20 σ_n C below the held 0.04 and never binds).
    quiet = _tiny_locks(0.01, "stale")
    clipped = torch.zeros(quiet.num_weights)
    draws = np.array(
        [
            quiet.release(clipped, torch.Generator().manual_seed(s), 0.04)[1]
            for s in range(4000)
        ]
    )
    sd = 0.01 * 4.0 * 0.05
    assert abs(draws.mean() - 0.04) < 5 * sd / math.sqrt(4000)
    assert abs(draws.std() - sd) < 5 * sd / math.sqrt(2 * 4000)


def test_ledger_charges_are_those_of_the_current_norm() -> None:
    stale, current = _trainer("stale"), _trainer("current")
    stale.run(4)
    current.run(4)
    assert stale.algorithm.event() == current.algorithm.event()
    for entry in stale.ledger.entries:
        assert entry.event == current.algorithm.event()  # one norm + update event
    # The first round is the same in both variants (no client has a stale norm).
    assert stale.ledger.entries[0].to_json() == current.ledger.entries[0].to_json()
    # Held norms: finite (in [0, C]) exactly for clients that were in S1.
    seen = sorted({k for e in stale.ledger.entries for k in e.participants})
    last = stale.algorithm.last_norm
    assert np.flatnonzero(last.numpy() >= 0).tolist() == seen
    assert float(last[seen].max()) <= 1.0  # capped at C


def test_a_norm_clipped_a_few_ulps_above_c_is_held_at_c() -> None:
    # Clipping a long float32 update to C leaves ‖ḡ‖ up to ~1e-6 above C
    # (found: 1.0000011 on Fashion-MNIST's logistic regression, d = 7850,
    # which then refused the next round's stale release). The held and the
    # released norm are capped at C, the range the release is priced for.
    alg = _tiny_locks(0.0, "stale", clip=1.0)
    rng = np.random.default_rng(3)
    overshot = 0
    for _ in range(200):
        g = torch.as_tensor(rng.normal(size=7850), dtype=torch.float32)
        clipped = g * (1.0 / g.norm())
        overshot += float(torch.linalg.vector_norm(clipped.double())) > 1.0
        assert alg.clipped_norm(clipped) <= 1.0
        noisy, released = alg.release(clipped, torch.Generator())
        assert released <= 1.0
        alg.release(clipped, torch.Generator(), alg.clipped_norm(clipped))
    assert overshot > 0  # the case arises: the test is not vacuous


def test_some_stale_norm_is_released_and_changes_the_run() -> None:
    stale, current = _trainer("stale"), _trainer("current")
    s1 = [set(stale.step().participants.tolist()) for _ in range(4)]
    for _ in range(4):
        current.step()
    assert any(a & b for a, b in zip(s1, s1[1:]))  # a client came back
    assert not torch.equal(stale.algorithm.weights, current.algorithm.weights)


def test_loop_and_batched_agree_and_resume_is_exact(tmp_path) -> None:
    loop, batched = _trainer("stale", "loop"), _trainer("stale", "batched")
    for _ in range(4):
        loop.step()
        batched.step()
    torch.testing.assert_close(
        loop.algorithm.weights, batched.algorithm.weights, atol=1e-5, rtol=0
    )
    assert [e.to_json() for e in loop.ledger.entries] == [
        e.to_json() for e in batched.ledger.entries
    ]
    first = _trainer("stale")
    first.run(2)
    torch.save(first.state_dict(), tmp_path / "ckpt.pt")
    first.ledger.save(tmp_path / "ledger.json")
    resumed = _trainer("stale")
    resumed.ledger = PrivacyLedger.load(tmp_path / "ledger.json")
    resumed.load_state_dict(torch.load(tmp_path / "ckpt.pt", weights_only=True))
    resumed.run(2)
    assert torch.equal(batched.algorithm.weights, resumed.algorithm.weights)
    assert torch.equal(batched.algorithm.last_norm, resumed.algorithm.last_norm)


def test_a_replica_computes_the_same_stale_messages() -> None:
    trainer = _trainer("stale")
    trainer.run(3)
    alg = trainer.algorithm
    replica = pickle.loads(pickle.dumps(alg.blueprint())).build()
    cohort = alg.select(3, server_streams(7, 3))
    assert any(float(t.state["last_norm"]) >= 0 for t in cohort.tasks)
    clients = [t.client for t in cohort.tasks]
    mine = alg.client_steps(alg.weights, cohort.tasks, CohortStreams(7, 3, clients))
    theirs = replica.client_steps(
        alg.weights.clone(), cohort.tasks, CohortStreams(7, 3, clients)
    )
    assert torch.equal(mine.vectors, theirs.vectors)
    assert torch.equal(mine.scalars["noisy_norm"], theirs.scalars["noisy_norm"])
    assert torch.equal(mine.states["last_norm"], theirs.states["last_norm"])
