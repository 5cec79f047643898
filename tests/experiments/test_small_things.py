"""Small usability fixes, one test each: Ctrl-C after the last round names the
resume command, a regression loss given class labels is one clear line, and
an algorithm-name typo in Python gets "did you mean". (The progress line's
test-loss label is in ``test_notebook_progress.py``.)
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import dpfl  # noqa: E402
from dpfl.cli.main import main  # noqa: E402
from dpfl.data import federate  # noqa: E402
from dpfl.errors import InvalidParameterError  # noqa: E402
from dpfl.sim.algorithms import build_algorithm  # noqa: E402


def _data(classes=5):
    y = np.random.default_rng(0).integers(0, classes, 550)
    x = np.random.default_rng(1).normal(size=(550, 8)).astype(np.float32)
    return federate(
        x[:500], y[:500], num_clients=50, test_features=x[500:], test_labels=y[500:]
    )


def test_ctrl_c_outside_the_rounds_prints_the_resume_command(
    tmp_path, monkeypatch, capsys
):
    import dpfl.experiments.runner as runner

    def interrupted_while_writing(*args, **kwargs):
        raise KeyboardInterrupt  # as if Ctrl-C came during the final writes

    monkeypatch.setattr(runner, "run", interrupted_while_writing)
    rc = main(["train", "fedavg-digits", "--out", str(tmp_path), "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 130
    assert f"dpfl resume {tmp_path / 'fedavg-digits'}" in err
    assert len(err.strip().splitlines()) == 1


def test_a_regression_loss_with_class_labels_is_one_clear_line():
    model = torch.nn.Linear(8, 5)
    with pytest.raises(InvalidParameterError) as info:
        dpfl.make_private(
            model,
            _data(),
            "dp-fedavg",
            epsilon=2.0,
            delta=1e-5,
            rounds=2,
            cohort_size=10,
            clip=1.0,
            loss_fn=torch.nn.MSELoss(),
        )
    text = str(info.value)
    assert text.startswith("loss_fn must take the model's output (shape (2, 5))")
    assert "class indices" in text and "use cross-entropy" in text
    assert "\n" not in text


def test_an_algorithm_typo_in_python_gets_did_you_mean():
    with pytest.raises(InvalidParameterError, match="did you mean 'dp-fedavg'"):
        dpfl.make_private(
            torch.nn.Linear(8, 5),
            _data(),
            "dp-fedavgg",
            epsilon=2.0,
            delta=1e-5,
            rounds=2,
            cohort_size=10,
        )
    with pytest.raises(InvalidParameterError, match="did you mean 'prifedsync'"):
        build_algorithm("prifedsyn", {}, model=torch.nn.Linear(8, 5), dataset=_data())
    with pytest.raises(InvalidParameterError) as info:  # nothing close: no guess
        build_algorithm("zzz", {}, model=torch.nn.Linear(8, 5), dataset=_data())
    assert "did you mean" not in str(info.value)
