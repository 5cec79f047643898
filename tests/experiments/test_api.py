"""dpfl.make_private: own model, own data, a target epsilon, one call."""

from __future__ import annotations

import math
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import dpfl  # noqa: E402
from dpfl.accounting import events as ev  # noqa: E402
from dpfl.accounting.calibrate import calibrate_noise_multiplier  # noqa: E402
from dpfl.accounting.ledger import PrivacyLedger  # noqa: E402
from dpfl.data import federate  # noqa: E402
from dpfl.errors import DpflError, InvalidParameterError  # noqa: E402
from dpfl.sim.callbacks import Callback  # noqa: E402

README = Path(__file__).resolve().parents[2] / "README.md"


def readme_block(section: str) -> str:
    """The first python block of README section ``section``."""
    text = README.read_text()
    start = text.index(f"\n## {section}\n")
    end = text.find("\n## ", start + 1)
    blocks = re.findall(r"```python\n(.*?)```", text[start:end], flags=re.S)
    assert blocks, f"README section {section!r} has no python block"
    return blocks[0]


def blobs(n=1100, clients=50, seed=0):
    """3 Gaussian classes in 20 dimensions, iid over ``clients`` clients."""
    y = np.random.default_rng(seed).integers(0, 3, n)
    x = np.random.default_rng(seed + 1).normal(size=(n, 20)) + 2 * np.eye(3, 20)[y]
    x = x.astype(np.float32)
    k = n - 100
    return federate(
        x[:k],
        y[:k],
        num_clients=clients,
        test_features=x[k:],
        test_labels=y[k:],
    )


def mlp(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(20, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3)
    )


# -- the README scenario ------------------------------------------------------------
def test_readme_train_your_own_model_runs_in_ten_lines(capsys):
    code = readme_block("Train your own model")
    lines = [
        line
        for line in code.splitlines()
        if line.strip() and not line.strip().startswith("#")
    ]
    assert len(lines) <= 10, f"the example takes {len(lines)} code lines"
    namespace: dict = {}
    exec(compile(code, "README.md", "exec"), namespace)  # noqa: S102
    trainer, result = namespace["trainer"], namespace["result"]
    # The event a user would pick by hand for DP-FedAvg with a fixed cohort of
    # 50 of 500 clients, calibrated by the accounting API directly (the
    # newcomer's 27-line path) with the ledger's bracket tolerance: the same σ.
    by_hand = calibrate_noise_multiplier(
        lambda s: ev.FixedCohort(50, 500, ev.Gaussian(s)),
        epsilon=2.0,
        delta=1e-5,
        rounds=20,
        bound_tolerance=PrivacyLedger().tolerance,
        tolerance=2e-3,
    )
    assert trainer.event == ev.FixedCohort(50, 500, ev.Gaussian(by_hand))
    assert trainer.noise_multiplier == pytest.approx(by_hand, rel=1e-12)
    assert trainer.analysis == "sound"
    assert trainer.guarantee["unit"] == "client"
    assert trainer.guarantee["status"] == "proven"
    # All 20 rounds ran, within the budget and calibrated tightly (the
    # calibration's relative tolerance is 2e-3; the ledger's bracket 0.02).
    assert result.stopped == "completed" and result.rounds_completed == 20
    assert 0.95 * 2.0 < result.epsilon <= 2.0
    assert result.epsilon == trainer.spent().upper
    rounds, accuracy = result.series("test_accuracy")
    assert rounds == list(range(2, 21, 2))  # ten evaluations by default
    # Chance is 1/3; the Bayes rate of these classes is about 0.8.
    assert result.metrics["test_accuracy"] > 0.6
    # the example prints sigma, epsilon spent and accuracy, in that order
    printed = capsys.readouterr().out.split()
    assert float(printed[0]) == pytest.approx(trainer.noise_multiplier, rel=1e-9)
    assert float(printed[1]) == pytest.approx(result.epsilon, rel=1e-9)


# -- same event and analysis as the config runner ----------------------------------
def test_make_private_and_the_runner_calibrate_the_same_sigma(tmp_path):
    from dpfl.experiments import config_from_dict
    from dpfl.experiments.build import build_dataset
    from dpfl.experiments.privacy import resolve_privacy

    config = config_from_dict(
        {
            "name": "same",
            "rounds": 15,
            "output_dir": str(tmp_path),
            "data": {"num_clients": 40, "records_per_client": 20},
            "model": {"name": "mlp", "options": {"hidden": 8}},
            "algorithm": {
                "name": "dp-fedavg",
                "params": {"cohort_size": 8, "clip": 1.0},
            },
            "privacy": {"epsilon": 3.0, "delta": 1e-3},
        }
    )
    dataset = build_dataset(config)
    resolved = resolve_privacy(config, dataset)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 10))
    trainer = dpfl.make_private(
        model,
        dataset,
        "dp-fedavg",
        epsilon=3.0,
        delta=1e-3,
        rounds=15,
        cohort_size=8,
        clip=1.0,
        progress=False,
    )
    assert trainer.noise_multiplier == resolved.privacy.noise_multiplier
    assert trainer.analysis == resolved.privacy.analysis


PARAMS = {
    "dp-fedavg": {"cohort_size": 10},
    "dsgd-rp": {"participation_probability": 0.3, "record_probability": 0.5},
    "prifedsync": {"sync_probability": 0.3, "batch_size": 4, "local_steps": 2},
    "ms-pafl": {"checkin_probability": 0.3, "batch_size": 4, "local_steps": 2},
    "locks": {"first_stage_probability": 0.4, "second_stage_size": 5},
}
EVENTS = {
    "dp-fedavg": ev.FixedCohort,
    "dsgd-rp": ev.ClientPoisson,
}


@pytest.mark.parametrize("name", sorted(PARAMS))
def test_every_private_algorithm_trains_one_round_and_charges_its_event(name):
    data = blobs()
    trainer = dpfl.make_private(
        mlp(),
        data,
        name,
        epsilon=None,
        delta=1e-4,
        rounds=1,
        noise_multiplier=2.0,
        progress=False,
        **PARAMS[name],
    )
    assert trainer.noise_multiplier == 2.0
    cls = trainer.algorithm
    assert trainer.event == type(cls).round_event(cls.params, cls.stats, 2.0)
    if name in EVENTS:
        assert isinstance(trainer.event, EVENTS[name])
    result = trainer.fit()
    assert result.rounds_completed == 1 and trainer.ledger.rounds == 1
    assert result.epsilon is not None and math.isfinite(result.epsilon)
    assert result.epsilon == pytest.approx(trainer.spent().upper)
    assert trainer.guarantee["private"] and trainer.guarantee["analysis"]


def test_fedavg_is_the_non_private_baseline_and_refuses_a_budget():
    data = blobs()
    with pytest.raises(InvalidParameterError, match="'fedavg' adds no noise") as info:
        dpfl.make_private(
            mlp(), data, "fedavg", epsilon=2.0, delta=1e-5, rounds=2, cohort_size=5
        )
    assert "epsilon=2.0" in str(info.value)
    trainer = dpfl.make_private(
        mlp(),
        data,
        "fedavg",
        epsilon=None,
        delta=None,
        rounds=2,
        cohort_size=5,
        progress=False,
    )
    result = trainer.fit()
    assert result.epsilon is None and trainer.ledger.rounds == 0
    assert trainer.guarantee["private"] is False
    assert result.history[-1]["private"] is False


def test_the_guard_stops_a_fit_past_the_planned_rounds():
    data = blobs()
    trainer = dpfl.make_private(
        mlp(),
        data,
        "dp-fedavg",
        epsilon=1.0,
        delta=1e-4,
        rounds=3,
        cohort_size=10,
        progress=False,
    )
    result = trainer.fit(rounds=40)
    assert result.stopped == "budget"
    assert 3 <= result.rounds_completed < 40
    assert result.epsilon <= 1.0
    # the stopped model was evaluated once more
    assert "test_accuracy" in result.history[-1]


# -- errors name the parameter, the constraint and the value ----------------------
@pytest.mark.parametrize(
    ("kwargs", "pattern"),
    [
        ({"epsilon": -1.0}, r"epsilon must be .*-1\.0"),
        ({"delta": None}, r"delta must be given .*got None"),
        ({"delta": 1.5}, r"delta must be in \(0, 1\).*1\.5"),
        ({"delta": 0.1}, r"delta must be < 1/n .*got 0\.1.*allow_large_delta=True"),
        ({"rounds": 0}, r"rounds must be >= 1; got 0"),
        ({"seed": -2}, r"seed must be >= 0; got -2"),
        ({"epsilon": None}, r"epsilon .* or noise_multiplier must be given"),
        ({"noise_multiplier": 0}, r"noise_multiplier 0 adds no noise"),
        ({"cohort_sise": 5}, r"does not take parameter\(s\) \['cohort_sise'\]"),
        ({"cohort_size": 500}, r"cohort_size .* must be <= .*500"),
        ({"analysis": "cs"}, r"analysis must be one of .*got 'cs'"),
        ({"analysis": "paper"}, r"analysis 'paper' is not a proven .*allow_unproven="),
        ({"callbacks": [print]}, r"callbacks\[0\] must be a .*Callback"),
    ],
)
def test_bad_arguments_are_refused_with_name_and_value(kwargs, pattern):
    args = {"epsilon": 2.0, "delta": 1e-4, "rounds": 5, "cohort_size": 10}
    args.update(kwargs)
    with pytest.raises(DpflError, match=pattern):
        dpfl.make_private(mlp(), blobs(), "dp-fedavg", progress=False, **args)


def test_unknown_algorithm_lists_the_registered_ones():
    with pytest.raises(InvalidParameterError, match=r"algorithm must be one of .*"):
        dpfl.make_private(mlp(), blobs(), "dp-sgd", epsilon=2.0, delta=1e-4, rounds=5)


def test_model_and_data_are_checked_before_training(monkeypatch):
    import dpfl.sim.plan

    def no_calibration(*args, **kwargs):
        raise AssertionError("calibrated before checking the model")

    # a model that cannot train on the data is refused before the calibration
    monkeypatch.setattr(dpfl.sim.plan, "calibrate_noise_multiplier", no_calibration)
    data = blobs()
    with pytest.raises(InvalidParameterError, match="model must be a torch.nn.Module"):
        dpfl.make_private("mlp", data, epsilon=2.0, delta=1e-4, rounds=5)
    with pytest.raises(InvalidParameterError, match=r"data must be .*federate"):
        dpfl.make_private(
            mlp(), (np.zeros((4, 20)), np.zeros(4)), epsilon=2.0, delta=1e-4, rounds=5
        )
    wide = torch.nn.Linear(7, 3)
    with pytest.raises(InvalidParameterError, match=r"model must accept .*\(20,\)"):
        dpfl.make_private(wide, data, epsilon=2.0, delta=1e-4, rounds=5, cohort_size=10)
    narrow = torch.nn.Linear(20, 2)  # the data has 3 classes
    with pytest.raises(InvalidParameterError, match=r"3 classes.*\(2, 2\)"):
        dpfl.make_private(
            narrow, data, epsilon=2.0, delta=1e-4, rounds=5, cohort_size=10
        )


def test_fit_takes_callbacks_and_train_is_fit():
    seen = []

    class Rounds(Callback):
        def on_round_end(self, state, record):
            seen.append(record["round"])

    trainer = dpfl.make_private(
        mlp(),
        blobs(),
        "dp-fedavg",
        epsilon=4.0,
        delta=1e-4,
        rounds=4,
        cohort_size=10,
        eval_every=2,
        progress=False,
        callbacks=[Rounds()],
    )
    first = trainer.fit(rounds=2)
    second = trainer.train(callbacks=[Rounds()])  # continues to round 4
    assert seen == [1, 2, 3, 3, 4, 4]
    assert [r["round"] for r in first.history] == [1, 2]
    assert [r["round"] for r in second.history] == [3, 4]
    assert second.rounds_completed == 4 and second.stopped == "completed"
    assert "PrivateTrainer(dp-fedavg" in repr(trainer)


def test_import_dpfl_stays_torch_free():
    code = (
        "import sys, dpfl, dpfl.accounting; "
        "assert 'torch' not in sys.modules, 'torch imported'; "
        "assert 'make_private' in dpfl.__all__; "
        "assert callable(dpfl.make_private); print('ok')"
    )
    src = str(Path(__file__).resolve().parents[2] / "src")
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": src, "PATH": "/usr/bin:/bin"},
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_all_names_exist():
    import dpfl.api

    assert all(hasattr(dpfl.api, name) for name in dpfl.api.__all__)
    assert all(hasattr(dpfl, name) for name in dpfl.__all__)
