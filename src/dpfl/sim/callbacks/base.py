"""The callback protocol: what the round loop hands its callbacks.

:class:`Callback` and its three hooks, the :class:`FitState` each hook gets,
the :class:`FitResult` a fit returns, and :func:`check_callbacks`.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dpfl.errors import InvalidParameterError

if TYPE_CHECKING:
    from dpfl.accounting.ledger import Budget
    from dpfl.sim.loop import Trainer

__all__ = ["Callback", "FitResult", "FitState", "check_callbacks"]


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
