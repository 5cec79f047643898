"""Notebooks and progress: the widget under Jupyter, compact reprs, the
clipping-rate warning, and the progress line's loss labelled as the test loss.
"""

from __future__ import annotations

import io
import logging
import sys
import types

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("tqdm")

from dpfl.accounting.ledger import Budget, PrivacyLedger  # noqa: E402
from dpfl.data import federate  # noqa: E402
from dpfl.errors import InvalidParameterError  # noqa: E402
from dpfl.sim.algorithms import build_algorithm  # noqa: E402
from dpfl.sim.callbacks import (  # noqa: E402
    ClippingWarning,
    FitResult,
    ProgressBar,
    ProgressLog,
    in_notebook,
    progress,
)
from dpfl.sim.loop import Trainer  # noqa: E402


def trainer(clip=1.0, seed=0):
    y = np.random.default_rng(0).integers(0, 3, 420)
    x = np.random.default_rng(1).normal(size=(420, 6)) + 2 * np.eye(3, 6)[y]
    data = federate(
        x[:400].astype(np.float32),
        y[:400],
        num_clients=20,
        test_features=x[400:].astype(np.float32),
        test_labels=y[400:],
    )
    torch.manual_seed(seed)
    alg = build_algorithm(
        "dp-fedavg",
        {"cohort_size": 5, "clip": clip},
        model=torch.nn.Linear(6, 3),
        dataset=data,
        noise_multiplier=1.0,
    )
    return Trainer(alg, ledger=PrivacyLedger(Budget(50.0, 1e-3)), seed=seed)


def test_progress_is_the_notebook_widget_under_a_jupyter_kernel(monkeypatch):
    assert not in_notebook()
    assert isinstance(progress(), ProgressLog)  # stderr is not a terminal here

    class Shell:
        config = {"IPKernelApp": {"connection_file": "kernel.json"}}

    fake = types.ModuleType("IPython")
    fake.get_ipython = lambda: Shell()
    monkeypatch.setitem(sys.modules, "IPython", fake)
    assert in_notebook()
    bar = progress()
    assert isinstance(bar, ProgressBar) and bar.file is None  # tqdm.auto decides
    # a terminal IPython (no kernel app) is not a notebook
    Shell.config = {"TerminalInteractiveShell": {}}
    assert not in_notebook()


def test_fit_result_repr_is_one_line_without_the_history():
    history = [{"round": i, "test_accuracy": 0.5} for i in range(1, 51)]
    r = FitResult(50, "completed", 2.99512, 1e-5, {"test_accuracy": 0.91234}, history)
    text = repr(r)
    assert "\n" not in text and len(text) < 200
    assert "history=[50 records]" in text and "epsilon=2.995" in text


def test_progress_line_labels_the_loss_as_the_test_loss():
    out = io.StringIO()
    trainer().fit(2, eval_every=1, name="blobs", callbacks=[ProgressLog(1, file=out)])
    line = out.getvalue().splitlines()[-1]
    assert "  test loss " in line and "  loss " not in line


def _records(shares):
    return [{"round": i + 1, "clipped_fraction": s} for i, s in enumerate(shares)]


class _State:
    name = "run"

    class trainer:  # noqa: N801
        class algorithm:  # noqa: N801
            class params:  # noqa: N801
                clip = 0.01


def _warnings(callback, shares, caplog):
    caplog.clear()
    callback.on_fit_begin(_State())
    with caplog.at_level(logging.WARNING, logger="dpfl.sim"):
        for record in _records(shares):
            callback.on_round_end(_State(), record)
    return [r.getMessage() for r in caplog.records if "clipped" in r.getMessage()]


def test_clipping_warning_after_five_rounds_in_a_row_once(caplog):
    cb = ClippingWarning()
    # four rounds over 80 %, a break, then five in a row: one warning, at the 5th
    shares = [0.9, 0.95, 0.9, 0.99, 0.5, 0.9, 0.9, 0.9, 0.9, 0.9, 0.9, 0.9]
    found = _warnings(cb, shares, caplog)
    assert len(found) == 1
    assert "more than 80% of updates were clipped" in found[0]
    assert "last 5 rounds" in found[0] and "round 10" in found[0]
    assert "clip bound (0.01)" in found[0] and "ClippingWarning(" in found[0]
    assert _warnings(cb, [0.9, 0.9, 0.9, 0.9, 0.8], caplog) == []  # 0.8 is not over


def test_clipping_warning_is_configurable_and_can_be_off(caplog):
    assert len(_warnings(ClippingWarning(0.95, rounds=2), [0.96, 0.97], caplog)) == 1
    assert _warnings(ClippingWarning(0.95, rounds=2), [0.9, 0.97], caplog) == []
    assert _warnings(ClippingWarning(None), [1.0] * 20, caplog) == []
    with pytest.raises(InvalidParameterError, match=r"fraction must be .*got 1.5"):
        ClippingWarning(1.5)
    with pytest.raises(InvalidParameterError, match="rounds must be >= 1"):
        ClippingWarning(rounds=0)


def test_a_real_run_with_a_tiny_clip_warns_by_default(caplog):
    with caplog.at_level(logging.WARNING, logger="dpfl.sim"):
        trainer(clip=1e-4).fit(6, eval_every=6)
    assert any("were clipped" in r.getMessage() for r in caplog.records)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="dpfl.sim"):
        trainer(clip=1e-4).fit(6, eval_every=6, callbacks=[ClippingWarning(None)])
    assert not any("were clipped" in r.getMessage() for r in caplog.records)
