"""Checkpoint files: the trainer's state, checksummed, and their callback.

:func:`save_checkpoint` writes the ledger (if it has a path), then the
trainer's state atomically, with a SHA-256 of the rest as its last line;
:func:`load_checkpoint` reads it back, checking the checksum, the format and
the run digest; :class:`Checkpoint` saves every N rounds and at the end.
"""

from __future__ import annotations

import hashlib
import io
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dpfl._files import atomic_write
from dpfl._validate import check_count
from dpfl.errors import DpflError
from dpfl.sim.callbacks.base import Callback, FitState

if TYPE_CHECKING:
    from dpfl.sim.loop import Trainer

__all__ = ["CHECKPOINT_FORMAT", "Checkpoint", "load_checkpoint", "save_checkpoint"]

#: Format number of a checkpoint file written by :func:`save_checkpoint`.
CHECKPOINT_FORMAT = 2


_TRAILER = b"\ndpfl-sha256:"


def save_checkpoint(
    path: str | Path, trainer: Trainer, *, run: str | None = None
) -> None:
    """Save the ledger (if it has a path), then the trainer's state, atomically.

    The ledger goes first, so the ledger on disk never holds fewer rounds
    than the checkpoint (:meth:`~dpfl.sim.loop.Trainer.load_state_dict`
    refuses that case). The state, ``{"format", "round", "run", "trainer"}``
    (``run``: the digest of the run it belongs to, a run folder's frozen
    configuration, :mod:`dpfl.experiments.rundir`), is written by
    :func:`torch.save` and followed by one line, ``dpfl-sha256:`` and the
    SHA-256 of every byte before it, which :func:`load_checkpoint` checks
    (:func:`torch.load` ignores it).

    Parameters
    ----------
    path : str or Path
        The checkpoint file.
    trainer : Trainer
        What to save.
    run : str or None
        Digest of the run (``None``: not tied to a run folder).
    """
    import torch

    if trainer.ledger.path is not None:
        trainer.ledger.save()
    state: dict[str, Any] = {
        "format": CHECKPOINT_FORMAT,
        "round": trainer.round,
        "run": run,
        "trainer": trainer.state_dict(),
    }
    buffer = io.BytesIO()
    torch.save(state, buffer)
    raw = buffer.getvalue()
    data = raw + _TRAILER + hashlib.sha256(raw).hexdigest().encode() + b"\n"
    atomic_write(Path(path), lambda fh: fh.write(data), binary=True, point="checkpoint")


def load_checkpoint(path: str | Path, *, run: str | None = None) -> dict[str, Any]:
    """Read a :func:`save_checkpoint` file and check it.

    Every byte must match the file's SHA-256 line; the state is then loaded
    with ``weights_only=True`` (no code runs), and ``run`` (when given) must
    be the run it was saved for.

    Parameters
    ----------
    path : str or Path
        The checkpoint file.
    run : str or None
        The digest of the run it must belong to (``None``: not checked).

    Returns
    -------
    dict
        The checkpoint (``"trainer"`` is :meth:`Trainer.state_dict`'s).

    Raises
    ------
    dpfl.errors.DpflError
        If the file is missing, cut short or corrupted (its checksum), not a
        dpfl checkpoint, or belongs to another run.
    """
    import torch

    p = Path(path)
    try:
        data = p.read_bytes()
    except FileNotFoundError:
        raise DpflError(f"checkpoint not found: {p}") from None
    raw, mark, tail = data.rpartition(_TRAILER)
    if not mark or tail.rstrip(b"\n") != hashlib.sha256(raw).hexdigest().encode():
        raise DpflError(
            f"{p} fails its checksum: the checkpoint was cut short, corrupted or "
            "altered; refusing it"
        )
    try:
        state = torch.load(io.BytesIO(raw), map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises many kinds on a damaged archive
        raise DpflError(
            f"{p} cannot be read ({type(exc).__name__}); refusing it"
        ) from None
    if not isinstance(state, dict) or state.get("format") != CHECKPOINT_FORMAT:
        raise DpflError(
            f"{p} is not a dpfl run checkpoint (format {CHECKPOINT_FORMAT})"
        )
    if run is not None and state.get("run") != run:
        raise DpflError(
            f"{p} belongs to another run (its run digest differs from run.json's)"
        )
    return state


class Checkpoint(Callback):
    """Save the trainer every ``every`` rounds and when the loop ends.

    The end-of-fit checkpoint is written when the loop ends by itself
    (completed, budget, Ctrl-C, a callback's stop), not when an exception
    ends it (a NaN model, a crash): a crashed run resumes from its last
    periodic checkpoint with a ledger that already holds the later rounds,
    which are replayed and confirmed, not charged again
    (:meth:`~dpfl.sim.loop.Trainer.load_state_dict`).

    Parameters
    ----------
    path : str or Path
        The checkpoint file (:func:`save_checkpoint`).
    every : int
        Period in rounds (>= 1).
    run : str or None
        Digest of the run (:func:`save_checkpoint`).
    """

    def __init__(
        self, path: str | Path, *, every: int = 50, run: str | None = None
    ) -> None:
        self.path = Path(path)
        self.every = check_count("every", every, minimum=1)
        self.run = run
        self._saved = -1

    def on_fit_begin(self, state: FitState) -> None:
        """Note that a checkpoint at the trainer's round exists already."""
        self._saved = state.trainer.round if self.path.exists() else -1

    def on_round_end(self, state: FitState, record: dict[str, Any]) -> None:
        """Save on every ``every``-th round."""
        if record["round"] % self.every == 0:
            save_checkpoint(self.path, state.trainer, run=self.run)
            self._saved = record["round"]

    def on_fit_end(self, state: FitState) -> None:
        """Save at the final round (only the ledger if that checkpoint exists)."""
        if state.error is not None:
            return
        trainer = state.trainer
        if self._saved != trainer.round:
            save_checkpoint(self.path, trainer, run=self.run)
            self._saved = trainer.round
        elif trainer.ledger.path is not None:
            trainer.ledger.save()
