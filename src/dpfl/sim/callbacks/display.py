"""Progress: a tqdm bar on a terminal, a plain line every few rounds elsewhere."""

from __future__ import annotations

import math
import sys
import time
from typing import IO, TYPE_CHECKING, Any

from dpfl._validate import check_count
from dpfl.sim.callbacks.base import Callback, FitState

if TYPE_CHECKING:
    pass

__all__ = ["ProgressBar", "ProgressLog", "progress"]


def _fields(state: FitState) -> dict[str, str]:
    """Loss, accuracy and ε spent (with the budget and δ) at the latest evaluation."""
    out: dict[str, str] = {}
    ev = state.evaluation
    if "test_loss" in ev:
        out["test loss"] = f"{ev['test_loss']:.3f}"
    if "test_accuracy" in ev:
        out["acc"] = f"{ev['test_accuracy']:.3f}"
    if not state.private:
        out["eps"] = "none (non-private)"
    elif state.epsilon is not None:
        budget = (
            ""
            if state.budget is None or math.isinf(state.budget.epsilon)
            else f"/{state.budget.epsilon:g}"
        )
        eps = f"{state.epsilon:.4g}{budget} at delta {state.delta:g}"
        if state.status != "proven":
            out["eps"] = f"{eps} ({state.status}, not a bound)"
            out["proven eps"] = f"{state.epsilon_proven:.3g}"
        else:
            out["eps"] = eps
    return out


class ProgressBar(Callback):
    """A tqdm progress bar: round, ETA, loss, accuracy, ε spent / budget at δ.

    Parameters
    ----------
    desc : str or None
        The bar's label (default: the fit's ``name``).
    file : file object or None
        Where the bar is drawn (default ``sys.stderr``).
    """

    def __init__(self, desc: str | None = None, *, file: IO[str] | None = None):
        self.desc = desc
        self.file = file
        self._bar: Any = None

    def on_fit_begin(self, state: FitState) -> None:
        """Open the bar at the trainer's round."""
        from tqdm.auto import tqdm

        self._bar = tqdm(
            total=state.rounds,
            initial=state.trainer.round,
            unit="round",
            desc=self.desc if self.desc is not None else state.name,
            dynamic_ncols=True,
            file=self.file,
        )

    def on_round_end(self, state: FitState, record: dict[str, Any]) -> None:
        """Advance; show the latest evaluation when this round had one."""
        if self._bar is None:
            return
        if state.evaluated_round == record["round"]:
            self._bar.set_postfix(_fields(state), refresh=False)
        self._bar.update(1)

    def on_fit_end(self, state: FitState) -> None:
        """Close the bar."""
        if self._bar is not None:
            if state.final_evaluation is not None:
                self._bar.set_postfix(_fields(state), refresh=False)
            self._bar.close()
            self._bar = None


class ProgressLog(Callback):
    """A plain progress line every ``every`` rounds, flushed at once.

    For output that is not a terminal (a log file, CI, ``nohup``), where a
    bar's carriage returns never reach the log: e.g. ::

        digits: round 20/100 (12.3 s)  test loss 0.512  acc 0.846  eps 1.21/4 at
        delta 1e-05

    (one line).

    Accuracy, test loss and ε are those of the latest evaluation.

    Parameters
    ----------
    every : int or None
        Period in rounds (>= 1); ``None``: about 20 lines per fit, on
        evaluation rounds. The last round and an early stop are always
        printed.
    desc : str or None
        The label (default: the fit's ``name``).
    file : file object or None
        Where the lines go (default ``sys.stderr``, read when printing).
    """

    def __init__(
        self,
        every: int | None = None,
        *,
        desc: str | None = None,
        file: IO[str] | None = None,
    ) -> None:
        self.every = None if every is None else check_count("every", every, minimum=1)
        self.desc = desc
        self.file = file
        self._every = 1

    def on_fit_begin(self, state: FitState) -> None:
        """Fix the period."""
        if self.every is not None:
            self._every = self.every
        else:
            steps = max(1, math.ceil(state.rounds / 20 / state.eval_every))
            self._every = steps * state.eval_every

    def _print(self, state: FitState, done: int, note: str = "") -> None:
        label = self.desc if self.desc is not None else state.name
        head = f"{label}: " if label else ""
        seconds = time.perf_counter() - state.started
        fields = "  ".join(f"{k} {v}" for k, v in _fields(state).items())
        file = self.file if self.file is not None else sys.stderr
        print(
            f"{head}round {done}/{state.rounds} ({seconds:.1f} s)  {fields}{note}",
            file=file,
            flush=True,
        )

    def on_round_end(self, state: FitState, record: dict[str, Any]) -> None:
        """Print on every ``every``-th round and on the last."""
        done = record["round"]
        if done % self._every == 0 or done == state.rounds:
            self._print(state, done)

    def on_fit_end(self, state: FitState) -> None:
        """Print where an early stop left the run."""
        if state.error is None and state.stopped not in (None, "completed"):
            self._print(state, state.trainer.round, f"  stopped: {state.stopped}")


def progress(
    *,
    every: int | None = None,
    desc: str | None = None,
    file: IO[str] | None = None,
) -> Callback:
    """A :class:`ProgressBar` on a terminal, else a :class:`ProgressLog`.

    Parameters
    ----------
    every : int or None
        The plain line's period in rounds (see :class:`ProgressLog`).
    desc : str or None
        The label (default: the fit's ``name``).
    file : file object or None
        Where progress goes (default ``sys.stderr``); a bar when it is a
        terminal (``isatty()``).

    Returns
    -------
    Callback
        The progress callback.
    """
    if file is None and in_notebook():
        return ProgressBar(desc)  # tqdm.auto draws a widget in a notebook
    stream = file if file is not None else sys.stderr
    isatty = getattr(stream, "isatty", None)
    if callable(isatty) and isatty():
        return ProgressBar(desc, file=file)
    return ProgressLog(every, desc=desc, file=file)


def in_notebook() -> bool:
    """Whether this process is a Jupyter kernel (IPython's kernel app is running)."""
    ipython = sys.modules.get("IPython")
    get = getattr(ipython, "get_ipython", None)
    shell = get() if callable(get) else None
    return shell is not None and "IPKernelApp" in getattr(shell, "config", {})
