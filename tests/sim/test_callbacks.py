"""Callbacks of the round loop: user hooks, files, progress, TensorBoard."""

from __future__ import annotations

import io
import json
import math
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("tqdm")

import dpfl.sim.callbacks as cbs  # noqa: E402
from dpfl.accounting.ledger import Budget, PrivacyLedger  # noqa: E402
from dpfl.data import federate  # noqa: E402
from dpfl.errors import DpflError, InvalidParameterError  # noqa: E402
from dpfl.experiments import config_from_dict, run  # noqa: E402
from dpfl.experiments.figures import AccuracyFigure  # noqa: E402
from dpfl.experiments.runner import read_metrics  # noqa: E402
from dpfl.sim.algorithms import build_algorithm  # noqa: E402
from dpfl.sim.callbacks import (  # noqa: E402
    Callback,
    MetricsFile,
    ProgressBar,
    ProgressLog,
    progress,
)
from dpfl.sim.loop import Trainer  # noqa: E402


def trainer(epsilon=50.0, sigma=1.0, seed=0):
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
        {"cohort_size": 5, "clip": 1.0},
        model=torch.nn.Linear(6, 3),
        dataset=data,
        noise_multiplier=sigma,
    )
    ledger = PrivacyLedger(Budget(epsilon, 1e-3) if sigma else None)
    return Trainer(alg, ledger=ledger, seed=seed)


class Recorder(Callback):
    def __init__(self):
        self.calls = []

    def on_fit_begin(self, state):
        self.calls.append(("begin", state.trainer.round))

    def on_round_end(self, state, record):
        self.calls.append(("round", dict(record)))

    def on_fit_end(self, state):
        self.calls.append(("end", state.stopped, state.error))


def test_callbacks_see_every_round_once_in_order():
    rec = Recorder()
    result = trainer().fit(5, eval_every=2, callbacks=[rec])
    assert rec.calls[0] == ("begin", 0)
    rounds = [c[1] for c in rec.calls[1:-1]]
    assert [r["round"] for r in rounds] == [1, 2, 3, 4, 5]
    assert rec.calls[-1] == ("end", "completed", None)
    # evaluation rounds (2, 4 and the last) carry accuracy and epsilon spent
    evaluated = [r["round"] for r in rounds if "test_accuracy" in r]
    assert evaluated == [2, 4, 5]
    assert rounds == result.history
    eps = [r["epsilon"] for r in rounds if "epsilon" in r]
    assert eps == sorted(eps) and eps[-1] == result.epsilon


def test_a_callback_stops_the_run_and_the_stopped_model_is_evaluated():
    class StopAt3(Callback):
        def on_round_end(self, state, record):
            if record["round"] == 3:
                state.stop("early-stopping")

    rec = Recorder()
    result = trainer().fit(10, eval_every=5, callbacks=[StopAt3(), rec])
    assert result.stopped == "early-stopping" and result.rounds_completed == 3
    # round 3 was not an evaluation round: the final evaluation is merged in
    assert "test_accuracy" in result.history[-1]
    assert "test_accuracy" not in rec.calls[-2][1]  # the record as first sent
    assert rec.calls[-1][1] == "early-stopping"


def test_the_budget_stop_reaches_callbacks_and_stays_within_budget():
    rec = Recorder()
    t = trainer(epsilon=1.0, sigma=3.0)
    result = t.fit(200, eval_every=100, callbacks=[rec])
    assert result.stopped == "budget" and rec.calls[-1][1] == "budget"
    assert 0 < result.rounds_completed < 200
    assert result.epsilon <= 1.0 == t.ledger.budget.epsilon


def test_an_error_reaches_on_fit_end_and_propagates():
    class Boom(Callback):
        def on_round_end(self, state, record):
            raise RuntimeError("boom")

    rec = Recorder()
    with pytest.raises(RuntimeError, match="boom"):
        trainer().fit(3, callbacks=[rec, Boom()])
    kind, stopped, error = rec.calls[-1]
    assert kind == "end" and isinstance(error, RuntimeError)


def test_callbacks_are_checked():
    with pytest.raises(InvalidParameterError, match=r"callbacks\[1\] .*got str"):
        trainer().fit(1, callbacks=[Recorder(), "tensorboard"])
    with pytest.raises(InvalidParameterError, match="rounds must be >= 1; got 0"):
        trainer().fit(0)


# -- progress -----------------------------------------------------------------------
class Tty(io.StringIO):
    def isatty(self):
        return True


def test_progress_is_a_bar_on_a_terminal_and_plain_lines_otherwise():
    assert isinstance(progress(file=Tty()), ProgressBar)
    assert isinstance(progress(file=io.StringIO()), ProgressLog)


def test_plain_progress_lines_every_n_rounds_with_accuracy_and_epsilon():
    out = io.StringIO()
    trainer().fit(6, eval_every=2, name="blobs", callbacks=[ProgressLog(4, file=out)])
    lines = out.getvalue().splitlines()
    # every 4th round and the last; the fields of the latest evaluation
    assert [line.split(" (")[0] for line in lines] == [
        "blobs: round 4/6",
        "blobs: round 6/6",
    ]
    for line in lines:
        assert "acc 0." in line and "  test loss " in line
        assert "eps " in line and "/50 at delta 0.001" in line


def test_plain_progress_default_period_follows_evaluations():
    out = io.StringIO()
    trainer().fit(8, eval_every=2, callbacks=[ProgressLog(file=out)])
    rounds = [
        int(line.split("round ")[1].split("/")[0])
        for line in out.getvalue().splitlines()
    ]
    assert rounds == [2, 4, 6, 8]  # at most ~20 lines, on evaluation rounds


def test_progress_bar_draws_to_its_file():
    out = Tty()
    trainer().fit(2, eval_every=1, callbacks=[ProgressBar("bar", file=out)])
    text = out.getvalue()
    assert "bar" in text and "2/2" in text and "acc=" in text


# -- the runner ---------------------------------------------------------------------
def tiny(tmp_path, name="tiny", **top):
    tree = {
        "name": name,
        "seed": 3,
        "rounds": 4,
        "output_dir": str(tmp_path / "runs"),
        "eval_every": 2,
        "checkpoint_every": 2,
        "data": {"num_clients": 20, "records_per_client": 10},
        "model": {"options": {"hidden": 8}},
        "algorithm": {"participation_probability": 0.5, "record_probability": 0.5},
        "privacy": {"epsilon": math.inf, "delta": 1e-5, "noise_multiplier": 1.0},
    }
    tree.update(top)
    return config_from_dict(tree)


def test_runner_without_a_terminal_prints_plain_progress(tmp_path, capsys):
    run(tiny(tmp_path), progress=True)
    err = capsys.readouterr().err  # pytest's capture is not a terminal
    assert "tiny: round 2/4" in err and "tiny: round 4/4" in err
    assert "\r" not in err  # no bar redraws in a log


def test_runner_passes_user_callbacks_the_records_it_writes(tmp_path):
    rec = Recorder()
    res = run(tiny(tmp_path), progress=False, callbacks=[rec, AccuracyFigure()])
    sent = [c[1] for c in rec.calls if c[0] == "round"]
    assert sent == read_metrics(res.run_dir)
    assert (res.run_dir / "accuracy.png").stat().st_size > 0
    assert (res.run_dir / "guarantee.json").exists()


def test_metrics_file_is_amended_after_an_early_stop(tmp_path):
    class StopAt3(Callback):
        def on_round_end(self, state, record):
            if record["round"] == 3:
                state.stop("enough")

    res = run(tiny(tmp_path), progress=False, callbacks=[StopAt3()])
    assert res.stopped == "enough" and res.rounds_completed == 3
    rows = read_metrics(res.run_dir)
    assert [r["round"] for r in rows] == [1, 2, 3]
    assert "test_accuracy" in rows[-1] and "epsilon" in rows[-1]
    ckpt = torch.load(res.run_dir / "checkpoint.pt", weights_only=False)
    assert ckpt["round"] == 3


def test_metrics_file_drops_records_past_the_trainer_round(tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_text("".join(json.dumps({"round": r}) + "\n" for r in (1, 2, 3)))
    t = trainer()
    t.round = 2  # as a resumed trainer whose checkpoint is at round 2
    mf = MetricsFile(path)
    state = cbs.FitState(t, 3, 1, 1e-3, True, "proven", None)
    mf.on_fit_begin(state)
    mf.on_round_end(state, {"round": 3, "x": 1.0})
    mf.on_fit_end(state)
    assert [json.loads(line) for line in path.read_text().splitlines()] == [
        {"round": 1},
        {"round": 2},
        {"round": 3, "x": 1.0},
    ]


# -- TensorBoard --------------------------------------------------------------------
def test_tensorboard_writes_every_evaluation_as_a_scalar(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import (
        EventAccumulator,
    )

    log_dir = tmp_path / "tb"
    result = trainer().fit(4, eval_every=2, callbacks=[cbs.TensorBoard(log_dir)])
    acc = EventAccumulator(str(log_dir))
    acc.Reload()
    scalars = acc.Scalars("test_accuracy")
    assert [s.step for s in scalars] == [2, 4]
    assert scalars[-1].value == pytest.approx(result.metrics["test_accuracy"])
    assert [s.step for s in acc.Scalars("epsilon")] == [2, 4]
    assert len(acc.Scalars("update_norm")) == 4  # the round metrics, every round


def test_tensorboard_in_a_run_folder(tmp_path):
    pytest.importorskip("tensorboard")
    res = run(tiny(tmp_path), progress=False, callbacks=[cbs.TensorBoard()])
    assert any((res.run_dir / "tensorboard").iterdir())
    with pytest.raises(InvalidParameterError, match="needs a fit that writes"):
        trainer().fit(1, callbacks=[cbs.TensorBoard()])


def test_tensorboard_without_the_extra_names_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorboard", None)
    with pytest.raises(DpflError, match=r"pip install 'dpfl\[track\]'") as info:
        cbs.TensorBoard("x")
    assert len(str(info.value).splitlines()) == 1


def test_all_names_exist():
    assert all(hasattr(cbs, name) for name in cbs.__all__)
