"""Trainer.abandon_round: a round given up before its server step.

The rule (docs/flower.md): nothing is released by the server, so the model
stays; the round is charged its checked event exactly when the clients'
messages are themselves releases (client-side noise), never otherwise.
"""

from __future__ import annotations

import pytest
import torch

from dpfl.accounting.ledger import PrivacyLedger
from dpfl.data import get_dataset
from dpfl.errors import DpflError
from dpfl.models import build_model
from dpfl.sim.algorithms import build_algorithm
from dpfl.sim.loop import Trainer

DATASET = get_dataset("digits", num_clients=12, seed=0, flatten=True)

CASES = {
    # name -> (params, model, messages are releases)
    "dp-fedavg": (
        dict(cohort_size=4, local_epochs=1, batch_size=8, learning_rate=0.1, clip=1.0),
        "mlp",
        False,
    ),
    "dsgd-rp": (
        dict(participation_probability=0.5, record_probability=0.5, learning_rate=0.5),
        "mlp",
        False,
    ),
    "dsgd-rp-untrusted": (
        dict(
            participation_probability=0.5,
            record_probability=0.5,
            learning_rate=0.5,
            server="untrusted",
        ),
        "mlp",
        True,
    ),
    "locks": (
        dict(
            first_stage_probability=0.5,
            second_stage_size=3,
            norm_noise_ratio=4.0,
            local_steps=2,
            batch_size=8,
        ),
        "logistic_regression",
        True,
    ),
    "ms-pafl": (
        dict(checkin_probability=0.5, local_steps=2, batch_size=8),
        "logistic_regression",
        True,
    ),
    "prifedsync": (
        dict(sync_probability=0.5, batch_size=8, local_steps=2, learning_rate=0.01),
        "mlp",
        True,
    ),
}


def _trainer(case: str) -> Trainer:
    params, model, _ = CASES[case]
    torch.manual_seed(0)
    net = build_model(
        model, input_shape=DATASET.input_shape, num_classes=DATASET.num_classes
    )
    alg = build_algorithm(
        case.removesuffix("-untrusted"),
        params,
        model=net,
        dataset=DATASET,
        noise_multiplier=1.0,
    )
    return Trainer(alg, ledger=PrivacyLedger(None), seed=3)


@pytest.mark.parametrize("case", sorted(CASES))
def test_abandoned_round_is_charged_iff_messages_are_releases(case):
    releases = CASES[case][2]
    trainer = _trainer(case)
    assert trainer.algorithm.messages_are_releases is releases
    trainer.step()
    weights = trainer.algorithm.weights.clone()
    plan = trainer.begin_round()
    report = trainer.abandon_round(plan)
    assert trainer.round == 2 and report.round == 1
    assert torch.equal(trainer.algorithm.weights, weights)  # nothing released
    assert report.metrics == {"abandoned": 1.0}
    entries = trainer.ledger.entries
    if releases:
        assert len(entries) == 2 and report.event == plan.event
        assert entries[1].round == 1 and entries[1].event == plan.event
        assert entries[1].extra == {"abandoned": True}
    else:
        assert len(entries) == 1 and report.event is None
    # the next round runs as the uninterrupted run's round 2 would
    trainer.step()
    assert trainer.ledger.entries[-1].round == 2


def test_abandon_refuses_a_stale_plan():
    trainer = _trainer("dp-fedavg")
    plan = trainer.begin_round()
    trainer.finish_round(
        plan,
        trainer.executor.run(
            trainer.algorithm,
            trainer.algorithm.weights,
            plan.cohort.tasks,
            plan.streams,
        ),
    )
    with pytest.raises(DpflError):
        trainer.abandon_round(plan)


def test_a_round_given_up_before_sending_is_never_charged():
    trainer = _trainer("locks")
    plan = trainer.begin_round()
    report = trainer.abandon_round(plan, sent=False)
    assert report.event is None and trainer.ledger.rounds == 0 and trainer.round == 1
