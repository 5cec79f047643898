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
:class:`AccuracyFigure`     ``accuracy.png`` of a run folder at the end
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

Examples
--------
>>> class PrintAccuracy(Callback):
...     def on_round_end(self, state, record):
...         if "test_accuracy" in record:
...             print(record["round"], record["test_accuracy"])
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import logging
import math
import sys
import time
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from dpfl._files import atomic_write, read_jsonl
from dpfl._validate import check_count
from dpfl.errors import DpflError, InvalidParameterError

if TYPE_CHECKING:
    from dpfl.accounting.ledger import Budget
    from dpfl.sim.loop import Trainer

__all__ = [
    "CHECKPOINT_FORMAT",
    "TRACK_HINT",
    "AccuracyFigure",
    "Callback",
    "Checkpoint",
    "ClippingWarning",
    "FitResult",
    "FitState",
    "MetricsFile",
    "ProgressBar",
    "ProgressLog",
    "TensorBoard",
    "check_callbacks",
    "load_checkpoint",
    "progress",
    "save_checkpoint",
]

log = logging.getLogger("dpfl.sim")

#: Format number of a checkpoint file written by :func:`save_checkpoint`.
CHECKPOINT_FORMAT = 2
#: How to install what :class:`TensorBoard` needs.
TRACK_HINT = "pip install 'dpfl[track]'"


@dataclasses.dataclass
class FitState:
    """What a running :meth:`~dpfl.sim.loop.Trainer.fit` knows; given to callbacks.

    Attributes
    ----------
    trainer : Trainer
        The trainer (its ``round``, ``algorithm`` and ``ledger``).
    rounds : int
        The round the fit runs to (the total, counted from round 0).
    eval_every : int
        Evaluation period in rounds (and at the last round).
    delta : float or None
        δ at which ε spent is reported (``None``: a non-private run).
    private : bool
        Whether the rounds are charged (noise was added).
    status : str or None
        Status of the ledger's analysis (``"proven"``, ...); beside an
        unproven one, ``epsilon_proven`` holds the proven figure.
    budget : Budget or None
        The ledger's budget.
    name : str
        A label for progress output.
    run_dir : Path or None
        The run folder, when the fit writes one.
    start_round : int
        The trainer's round when the fit began (0, or where a resume starts).
    history : list of dict
        Every record so far (the same dicts the callbacks received).
    evaluation : dict of str to float
        The latest evaluation (``test_loss``, ``test_accuracy``).
    evaluated_round : int or None
        Rounds completed at the latest evaluation.
    epsilon : float or None
        ε spent at the latest evaluation (upper bound at ``delta`` for the
        worst-off privacy unit under the ledger's analysis).
    epsilon_proven : float or None
        The proven ε at the latest evaluation, beside an unproven analysis.
    stopped : str or None
        Set when the loop ends: ``"completed"``, ``"budget"`` (the guard
        refused the next round), ``"interrupted"`` (Ctrl-C) or the reason a
        callback gave to :meth:`stop`.
    error : BaseException or None
        In :meth:`Callback.on_fit_end`: the exception ending the fit, if
        any (then nothing should be saved as if the run ended cleanly).
    final_evaluation : dict or None
        In :meth:`Callback.on_fit_end`: when the loop stopped early after an
        unevaluated round, the evaluation made then, merged into that round's
        record (``history[-1]``), which a file writer should amend.
    started : float
        ``time.perf_counter()`` at the start.
    """

    trainer: Trainer
    rounds: int
    eval_every: int
    delta: float | None
    private: bool
    status: str | None
    budget: Budget | None
    name: str = ""
    run_dir: Path | None = None
    start_round: int = 0
    history: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    evaluation: dict[str, float] = dataclasses.field(default_factory=dict)
    evaluated_round: int | None = None
    epsilon: float | None = None
    epsilon_proven: float | None = None
    stopped: str | None = None
    error: BaseException | None = None
    final_evaluation: dict[str, Any] | None = None
    started: float = dataclasses.field(default_factory=time.perf_counter)
    _stop: str | None = None

    def stop(self, reason: str = "callback") -> None:
        """Ask the loop to end after the current round (``stopped = reason``)."""
        self._stop = str(reason)

    @property
    def stop_requested(self) -> str | None:
        """The reason given to :meth:`stop`, if any."""
        return self._stop


@dataclasses.dataclass(frozen=True)
class FitResult:
    """What :meth:`~dpfl.sim.loop.Trainer.fit` did.

    Attributes
    ----------
    rounds_completed : int
        The trainer's round at the end (charged rounds, for a private run).
    stopped : str
        ``"completed"``, ``"budget"``, ``"interrupted"`` or a callback's
        reason.
    epsilon : float or None
        ε spent at the end (upper bound at ``delta``, worst-off unit, the
        ledger's analysis); ``None`` for a non-private run.
    delta : float or None
        The δ of ``epsilon``.
    metrics : dict of str to float
        The last evaluation (``test_loss``, ``test_accuracy``).
    history : list of dict
        One record per round run: ``round`` (rounds completed), the round's
        metrics and, on evaluation rounds, ``test_loss``, ``test_accuracy``
        and ``epsilon`` (with ``epsilon_status`` and ``epsilon_proven``
        under an unproven analysis).
    """

    rounds_completed: int
    stopped: str
    epsilon: float | None
    delta: float | None
    metrics: dict[str, float]
    history: list[dict[str, Any]]

    def __repr__(self) -> str:
        """One line: the outcome and the last evaluation, not the history.

        Examples
        --------
        >>> r = FitResult(2, "completed", 1.0, 1e-5, {"test_accuracy": 0.5},
        ...     [{"round": 1}, {"round": 2}])
        >>> repr(r).endswith("metrics={'test_accuracy': 0.5}, history=[2 records])")
        True
        """
        eps = "None" if self.epsilon is None else f"{self.epsilon:.4g}"
        delta = "None" if self.delta is None else f"{self.delta:g}"
        metrics = {k: round(v, 4) for k, v in self.metrics.items()}
        return (
            f"FitResult(rounds_completed={self.rounds_completed}, "
            f"stopped={self.stopped!r}, epsilon={eps}, delta={delta}, "
            f"metrics={metrics}, history=[{len(self.history)} records])"
        )

    def series(self, key: str) -> tuple[list[int], list[float]]:
        """Rounds and values of ``key`` over the records that hold it.

        Examples
        --------
        >>> r = FitResult(2, "completed", 1.0, 1e-5, {}, [{"round": 1},
        ...     {"round": 2, "test_accuracy": 0.5}])
        >>> r.series("test_accuracy")
        ([2], [0.5])
        """
        rows = [r for r in self.history if r.get(key) is not None]
        return [int(r["round"]) for r in rows], [float(r[key]) for r in rows]


class Callback:
    """Base of the callbacks of :meth:`~dpfl.sim.loop.Trainer.fit` (hooks do nothing).

    Override any of :meth:`on_fit_begin`, :meth:`on_round_end` and
    :meth:`on_fit_end`.
    """

    def on_fit_begin(self, state: FitState) -> None:
        """Called once before the first round."""

    def on_round_end(self, state: FitState, record: dict[str, Any]) -> None:
        """Called after each round with its record (``record["round"]`` done)."""

    def on_fit_end(self, state: FitState) -> None:
        """Called once at the end, also when an exception ends the fit.

        ``state.stopped`` says why the loop ended; ``state.error`` is the
        exception, if one is propagating.
        """


def check_callbacks(callbacks: Any) -> list[Callback]:
    """``callbacks`` as a list of :class:`Callback` (``None``: none).

    Raises
    ------
    dpfl.errors.InvalidParameterError
        If it is not a sequence of Callback objects (names the first that is
        not).
    """
    if callbacks is None:
        return []
    if isinstance(callbacks, Callback):
        callbacks = [callbacks]
    try:
        items = list(callbacks)
    except TypeError:
        raise InvalidParameterError(
            "callbacks must be a list of dpfl.sim.callbacks.Callback objects; got "
            f"{type(callbacks).__name__}"
        ) from None
    for i, cb in enumerate(items):
        if not isinstance(cb, Callback):
            raise InvalidParameterError(
                f"callbacks[{i}] must be a dpfl.sim.callbacks.Callback (subclass it "
                f"and override on_round_end); got {type(cb).__name__}"
            )
    return items


# -- files ------------------------------------------------------------------------
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


# -- progress ---------------------------------------------------------------------
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


class ClippingWarning(Callback):
    """Warn once when most updates are clipped for several rounds in a row.

    Reads each round record's ``clipped_fraction`` (the share of clipped
    updates or records, which DP-DSGD, DP-FedAvg and MS-PAFL report). When
    it exceeds ``fraction`` in ``rounds`` consecutive rounds, one warning
    goes to the ``dpfl.sim`` logger: a clip bound that cuts nearly every
    update throws away the updates' scale (the noise, set by the clip, then
    weighs more against them), and a larger bound often trains better at the
    same privacy.

    Parameters
    ----------
    fraction : float or None
        The clipped share, in (0, 1], above which a round counts (default
        0.8); ``None`` turns the warning off.
    rounds : int
        Consecutive such rounds before the warning (default 5).

    Examples
    --------
    >>> ClippingWarning(fraction=0.9, rounds=10).rounds
    10
    """

    def __init__(self, fraction: float | None = 0.8, rounds: int = 5) -> None:
        if fraction is not None and not (
            isinstance(fraction, int | float) and 0.0 < fraction <= 1.0
        ):
            raise InvalidParameterError(
                f"fraction must be a number in (0, 1] or None; got {fraction!r}"
            )
        self.fraction = None if fraction is None else float(fraction)
        self.rounds = check_count("rounds", rounds, minimum=1)
        self._streak = 0
        self._warned = False

    def on_fit_begin(self, state: FitState) -> None:
        """Start counting afresh."""
        self._streak = 0
        self._warned = False

    def on_round_end(self, state: FitState, record: dict[str, Any]) -> None:
        """Count the round if most of it was clipped; warn at the streak's end."""
        share = record.get("clipped_fraction")
        if self.fraction is None or self._warned or share is None:
            return
        self._streak = self._streak + 1 if share > self.fraction else 0
        if self._streak < self.rounds:
            return
        self._warned = True
        clip = getattr(getattr(state.trainer.algorithm, "params", None), "clip", None)
        bound = (
            f"the clip bound ({clip:g})"
            if isinstance(clip, int | float)
            else ("the clip bound")
        )
        log.warning(
            "%s: more than %.0f%% of updates were clipped in each of the last %d "
            "rounds (%.0f%% in round %d): %s is probably small for these updates; "
            "a larger one (or adaptive clipping) usually trains better at the same "
            "privacy. Change this check with ClippingWarning(fraction=..., "
            "rounds=...) among the callbacks (fraction=None: off).",
            state.name or "training",
            100 * self.fraction,
            self.rounds,
            100 * share,
            record["round"],
            bound,
        )


# -- tracking ---------------------------------------------------------------------
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
