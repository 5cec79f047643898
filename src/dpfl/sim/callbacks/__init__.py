"""Callbacks: what a training run does besides training.

:meth:`dpfl.sim.loop.Trainer.fit` runs rounds, evaluates the model every
``eval_every`` rounds with the ε spent so far, and hands each round's record
to its callbacks. Everything else a run does is one of them:

==========================  ===================================================
:class:`MetricsFile`        one JSON line per round (``metrics.jsonl``)
:class:`Checkpoint`         the trainer's state every N rounds and at the end
:class:`ProgressBar`        a tqdm bar: round, test loss, accuracy, ε spent / budget
:class:`ProgressLog`        the same as a plain line every N rounds (no terminal)
:class:`ClippingWarning`    a warning when most updates are clipped, round after round
:class:`TensorBoard`        every number of every record as a TensorBoard scalar
==========================  ===================================================

:func:`progress` picks the bar when its stream is a terminal, a notebook
widget under Jupyter, and the plain line otherwise (a log file, CI,
``nohup``), so a long run shows progress wherever its output goes.
:meth:`~dpfl.sim.loop.Trainer.fit` adds a :class:`ClippingWarning` unless
its callbacks hold one (pass your own to change its thresholds).

A callback subclasses :class:`Callback` and overrides any of its three hooks.
Each gets the :class:`FitState` (the trainer, the target, the latest
evaluation and ε); :meth:`Callback.on_round_end` also gets the round's
record, the dict written to ``metrics.jsonl``. A callback may end the run
early with :meth:`FitState.stop` (e.g. early stopping on accuracy); the
round in progress always completes and is charged first.

The modules: :mod:`~dpfl.sim.callbacks.base` (the protocol),
:mod:`~dpfl.sim.callbacks.metrics`, :mod:`~dpfl.sim.callbacks.checkpoint`
(checkpoint files and their callback), :mod:`~dpfl.sim.callbacks.display`
(progress), :mod:`~dpfl.sim.callbacks.clipping` and
:mod:`~dpfl.sim.callbacks.tracking`. The engine draws nothing: figures are
callbacks of the experiments layer
(:class:`dpfl.experiments.figures.AccuracyFigure`).

Examples
--------
>>> class PrintAccuracy(Callback):
...     def on_round_end(self, state, record):
...         if "test_accuracy" in record:
...             print(record["round"], record["test_accuracy"])
"""

from dpfl.sim.callbacks.base import Callback, FitResult, FitState, check_callbacks
from dpfl.sim.callbacks.checkpoint import (
    CHECKPOINT_FORMAT,
    Checkpoint,
    load_checkpoint,
    save_checkpoint,
)
from dpfl.sim.callbacks.clipping import ClippingWarning
from dpfl.sim.callbacks.display import ProgressBar, ProgressLog, in_notebook, progress
from dpfl.sim.callbacks.metrics import MetricsFile
from dpfl.sim.callbacks.tracking import TRACK_HINT, TensorBoard

__all__ = [
    "CHECKPOINT_FORMAT",
    "TRACK_HINT",
    "Callback",
    "Checkpoint",
    "ClippingWarning",
    "FitResult",
    "FitState",
    "MetricsFile",
    "ProgressBar",
    "ProgressLog",
    "TensorBoard",
    "in_notebook",
    "check_callbacks",
    "load_checkpoint",
    "progress",
    "save_checkpoint",
]
