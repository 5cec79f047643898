"""Tracking: every number of every record as a TensorBoard scalar."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dpfl.errors import DpflError, InvalidParameterError
from dpfl.sim.callbacks.base import Callback, FitState

if TYPE_CHECKING:
    pass

__all__ = ["TRACK_HINT", "TensorBoard"]

#: How to install what :class:`TensorBoard` needs.
TRACK_HINT = "pip install 'dpfl[track]'"


class TensorBoard(Callback):
    """Write every number of every round's record as a TensorBoard scalar.

    Tags are the record's keys (``test_accuracy``, ``test_loss``,
    ``epsilon``, the algorithm's round metrics), the step is the round.
    Needs the ``track`` extra (``pip install 'dpfl[track]'``); view with
    ``tensorboard --logdir LOG_DIR``.

    Parameters
    ----------
    log_dir : str or Path or None
        Where the event files go; ``None``: ``RUN_DIR/tensorboard`` of a run
        that writes a folder (required otherwise).
    prefix : str
        Prepended to every tag (e.g. ``"dpfl/"``).

    Raises
    ------
    dpfl.errors.DpflError
        If TensorBoard is not installed (the message names the extra).
    """

    def __init__(self, log_dir: str | Path | None = None, *, prefix: str = "") -> None:
        try:
            import tensorboard  # noqa: F401
        except ModuleNotFoundError as exc:
            if exc.name != "tensorboard":
                raise
            raise DpflError(
                f"TensorBoard logging needs tensorboard, which is not installed: "
                f"{TRACK_HINT}"
            ) from None
        self.log_dir = None if log_dir is None else Path(log_dir)
        self.prefix = str(prefix)
        self._writer: Any = None

    def on_fit_begin(self, state: FitState) -> None:
        """Open the writer."""
        from torch.utils.tensorboard import SummaryWriter

        log_dir = self.log_dir
        if log_dir is None:
            if state.run_dir is None:
                raise InvalidParameterError(
                    "TensorBoard(log_dir=None) needs a fit that writes a run folder; "
                    "give log_dir"
                )
            log_dir = state.run_dir / "tensorboard"
        self._writer = SummaryWriter(log_dir=str(log_dir))

    def _write(self, record: dict[str, Any]) -> None:
        step = int(record["round"])
        for key, value in record.items():
            if key == "round" or isinstance(value, bool):
                continue
            if isinstance(value, (int, float)) and math.isfinite(value):
                self._writer.add_scalar(self.prefix + key, float(value), step)

    def on_round_end(self, state: FitState, record: dict[str, Any]) -> None:
        """Add the record's numbers at step ``round``."""
        if self._writer is not None:
            self._write(record)

    def on_fit_end(self, state: FitState) -> None:
        """Add a final evaluation, if any, then flush and close."""
        if self._writer is None:
            return
        if state.final_evaluation is not None and state.error is None:
            self._write(state.final_evaluation)
        self._writer.flush()
        self._writer.close()
        self._writer = None
