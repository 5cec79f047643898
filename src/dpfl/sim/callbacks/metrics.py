"""``metrics.jsonl``: one JSON line per round (:class:`MetricsFile`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from dpfl._files import atomic_write, read_jsonl
from dpfl.errors import DpflError
from dpfl.sim.callbacks.base import Callback, FitState

if TYPE_CHECKING:
    pass

__all__ = ["MetricsFile"]


class MetricsFile(Callback):
    """Append each round's record to a JSON Lines file, flushed at once.

    On start, records of rounds after the trainer's round are dropped (a
    resumed run re-runs them, so the file never holds a round twice). When
    the loop stops early after an unevaluated round, that round's line is
    amended with the final evaluation.

    Parameters
    ----------
    path : str or Path
        The file (``metrics.jsonl`` of a run folder).
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._fh: IO[str] | None = None

    def on_fit_begin(self, state: FitState) -> None:
        """Keep the records up to the trainer's round, then open for appending."""
        if self.path.exists():
            kept = [
                r
                for r in read_jsonl(self.path)
                if int(r.get("round", 0)) <= state.trainer.round
            ]
            text = "".join(json.dumps(r) + "\n" for r in kept)
            atomic_write(self.path, lambda fh: fh.write(text), binary=False)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fh = self.path.open("a")

    def on_round_end(self, state: FitState, record: dict[str, Any]) -> None:
        """Write the record as one line and flush it."""
        if self._fh is None:
            raise DpflError("MetricsFile.on_round_end before on_fit_begin")
        self._fh.write(json.dumps(record) + "\n")
        self._fh.flush()

    def on_fit_end(self, state: FitState) -> None:
        """Amend the last line with a final evaluation, if any; close the file."""
        if self._fh is None:
            return
        self._fh.close()
        self._fh = None
        final = state.final_evaluation
        if final is None or state.error is not None:
            return
        rows = read_jsonl(self.path)
        if rows and rows[-1].get("round") == final["round"]:
            rows[-1].update(final)
        else:
            rows.append(final)
        text = "".join(json.dumps(r) + "\n" for r in rows)
        atomic_write(self.path, lambda fh: fh.write(text), binary=False)
