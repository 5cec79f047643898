"""Figures of a run, drawn as callbacks of the round loop.

The engine (:mod:`dpfl.sim`) draws nothing; a run that wants a figure adds
one of these to its callbacks (``dpfl train`` adds :class:`AccuracyFigure`).
"""

from __future__ import annotations

import logging

from dpfl.errors import DpflError
from dpfl.sim.callbacks import Callback, FitState

__all__ = ["AccuracyFigure"]

log = logging.getLogger("dpfl.experiments")


class AccuracyFigure(Callback):
    """Draw ``accuracy.png`` of the run folder when the fit ends.

    Accuracy against rounds and against ε spent
    (:func:`dpfl.plotting.plot_runs` over the folder's ``metrics.jsonl``);
    nothing when no round was evaluated or the fit has no run folder.

    Parameters
    ----------
    filename : str
        The figure's name inside the run folder.
    """

    def __init__(self, filename: str = "accuracy.png") -> None:
        self.filename = filename

    def on_fit_end(self, state: FitState) -> None:
        """Draw the figure (skipped after an error or without a run folder)."""
        if state.error is not None or state.run_dir is None:
            return
        from dpfl.plotting import plot_runs

        try:
            plot_runs([state.run_dir], state.run_dir / self.filename)
        except DpflError as exc:
            log.info("no figure: %s", exc)
