"""Run a configured experiment: data, model, algorithm, ledger, loop, files.

:func:`run` turns a :class:`~dpfl.experiments.config.RunConfig` into a run
folder ``output_dir/name/`` holding

``config.yaml``
    The resolved configuration (a calibrated noise multiplier filled in), so
    that ``dpfl resume`` never calibrates again.
``metrics.jsonl``
    One JSON object per completed round (``round`` = rounds completed), with
    ``test_loss``, ``test_accuracy`` and ``epsilon`` (spent so far by the
    worst-off privacy unit, upper bound at the budget's δ; ``null`` with
    ``"private": false`` for a run without noise) on evaluation rounds; under
    an unproven analysis also ``epsilon_status`` and ``epsilon_proven``.
``ledger.json``
    The privacy ledger, saved by the trainer after every charged round
    (rounds since the last snapshot in ``ledger.json.journal``): each entry
    holds the round's event, participants and a digest of the model after
    it, linked into a hash chain.
``checkpoint.pt``
    Trainer state (model, momentum, round, seed, and the ledger's entry count
    and chain hash at that point), written atomically every
    ``checkpoint_every`` rounds, on Ctrl-C, on a budget stop and at the end;
    its last line is a SHA-256 of the rest.
``guarantee.json``
    What the run's privacy amounts to at the end: ε of the worst-off privacy
    unit at the budget's δ, with the unit, neighbouring relation, adversary,
    analysis and its status; beside an unproven analysis, the proven ε; and
    every other analysis of the scheme with its status.
``run.json``
    The run's identity, written when the run starts
    (:mod:`dpfl.experiments.rundir`): its frozen definition (data, model,
    algorithm, privacy with σ as calibrated, seed, rounds), the fingerprints
    of its key and data, its noise stream, and their digest.
``secret.key``
    The run's secret noise key (owner-only), made by the run.
``.lock``
    The folder's lock: one ``dpfl train`` or ``dpfl resume`` at a time.

The run is assembled by :mod:`dpfl.experiments.build` (data, model,
algorithm, privacy plan, ledger, executor) and its folder started or
reopened by :mod:`dpfl.experiments.runfolder`. The round loop is
:meth:`dpfl.sim.loop.Trainer.fit` (:func:`fit_run`); the files above (except
``config.yaml`` and ``run.json``), the progress display and anything a
caller adds (``callbacks=``: TensorBoard,
:class:`~dpfl.experiments.figures.AccuracyFigure`'s ``accuracy.png``, your
own) are its callbacks (:mod:`dpfl.sim.callbacks`). Progress is a bar on a terminal
and a plain line every few rounds otherwise (a log file, CI, ``nohup``).

The run stops cleanly when the ledger's guard refuses a round
(:class:`~dpfl.errors.BudgetExceededError`): "budget reached at round k".
Ctrl-C finishes the current round, saves a checkpoint and the ledger, and
returns (a second Ctrl-C aborts at once). A round whose model or metrics are
NaN or Inf stops the run with an error naming the round, before anything of
it is checkpointed.

Resuming. :func:`resume` continues a stopped or killed run exactly: the same
final model and the same ledger as an uninterrupted run. The ledger is saved
after every round, checkpoints are less frequent, so a run killed between
two checkpoints holds rounds in its ledger that its checkpoint does not
have. They are *replayed*, not charged again: the guard is not asked again
for them (they were admitted when they first ran), each is computed from its
own random streams (keyed by the run's secret key, or its seed, and the
round), and its ledger entry (event,
participants, extra facts, model digest) must come out equal, or the run
stops with :class:`~dpfl.accounting.chain.LedgerMismatchError` naming the
round; the ledger on disk keeps every entry throughout, so the spend is never
under-stated. A ledger without a checkpoint (a kill before the first) is
replayed from round 0. A round replays bit for bit on the same executor,
device, torch build and number of torch threads (matrix products sum in an
order that depends on the thread count): ``run.json`` records the count the
run started with and an in-process replay uses it; resuming on another kind
of machine or executor with rounds to replay stops at the first of them.

Before any work, a run (and ``dpfl train --check``) passes
:func:`dpfl.experiments.build.prepare`:
the data's files, sizes and δ against what the configuration already bounds,
the data read, σ calibrated within a time limit, the model's size against
memory and time (:mod:`dpfl.experiments.checks`). A new run refuses a folder
that holds a key, ledger, checkpoint or ``run.json``, and makes its own key.

Before resuming, the folder is checked: ``config.yaml``'s frozen keys against
``run.json`` (``noise_multiplier: 0`` written into a stopped run's config is
refused, and a calibrated σ is never calibrated again), the key file (its
mode, and its fingerprint against ``run.json``'s), the data's fingerprint, the
recorded noise stream, the ledger's and checkpoint's checksums and their run
identity, the checkpoint's ledger position against the ledger and its model
against the ledger's digest for that round, each ledger entry against what
the frozen algorithm charges, and a missing ledger beside a run that started.
Any failure is an error naming the file; nothing is ever reset to zero spend.
The checksums catch accidents, careless edits and files mixed from two runs,
not someone with write access who forges a whole consistent folder.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dpfl._files import read_jsonl
from dpfl.errors import DpflError
from dpfl.experiments import rundir, runfolder
from dpfl.experiments.build import build_trainer, prepare, run_callbacks
from dpfl.experiments.config import (
    ConfigError,
    RunConfig,
    config_from_dict,
    load_config,
)
from dpfl.sim.callbacks import Callback, check_callbacks, load_checkpoint

if TYPE_CHECKING:
    from dpfl.sim.loop import Trainer
    from dpfl.sim.rounds import RoundReport

__all__ = [
    "RESUME_KEYS",
    "RunResult",
    "fit_run",
    "read_metrics",
    "resume",
    "run",
]

log = logging.getLogger("dpfl.experiments")


@dataclasses.dataclass(frozen=True)
class RunResult:
    """What a run did.

    Attributes
    ----------
    run_dir : Path
        The run folder.
    config : RunConfig
        The resolved configuration (noise multiplier filled in).
    rounds_completed : int
        Rounds completed (and charged, for a private run).
    stopped : str
        ``"completed"``, ``"budget"`` (the guard refused the next round),
        ``"interrupted"`` (Ctrl-C) or the reason a callback gave to
        :meth:`~dpfl.sim.callbacks.FitState.stop`.
    epsilon : float or None
        ε spent by the worst-off privacy unit (upper bound at the budget's δ)
        under the run's analysis; ``None`` for a non-private run (no noise:
        no guarantee).
    metrics : dict of str to float
        The last evaluation (``test_loss``, ``test_accuracy``).
    guarantee : dict
        What ``guarantee.json`` holds: the ledger's summary (ε, δ, unit,
        neighbouring relation, adversary, analysis, status, and the proven ε
        beside an unproven one), or ``{"private": False}``.
    """

    run_dir: Path
    config: RunConfig
    rounds_completed: int
    stopped: str
    epsilon: float | None
    metrics: dict[str, float]
    guarantee: dict[str, Any] = dataclasses.field(default_factory=dict)


# -- files ------------------------------------------------------------------------
def read_metrics(run_dir: str | Path) -> list[dict[str, Any]]:
    """Read ``metrics.jsonl`` of a run (one dict per completed round).

    Parameters
    ----------
    run_dir : str or Path
        The run folder.

    Returns
    -------
    list of dict
        The records, in file order; a torn last line (a crash mid-write) is
        skipped.

    Raises
    ------
    DpflError
        If the file does not exist.
    """
    path = Path(run_dir) / rundir.METRICS
    if not path.exists():
        raise DpflError(f"no {rundir.METRICS} in {run_dir}")
    return read_jsonl(path)


# -- the run ------------------------------------------------------------------------
def run(
    config: RunConfig,
    *,
    progress: bool = True,
    resume: bool = False,
    callbacks: Sequence[Callback] | None = None,
) -> RunResult:
    """Run an experiment (or continue one) and write its folder.

    Parameters
    ----------
    config : RunConfig
        The experiment. A ``noise_multiplier`` of ``None`` is calibrated so that
        ``rounds`` rounds fit the budget
        (:func:`dpfl.accounting.calibrate.calibrate_noise_multiplier`); 0 runs
        without noise (non-private).
    progress : bool
        Show progress (round, test loss and accuracy, ε spent): a bar on a
        terminal, else a plain line every few rounds
        (:func:`dpfl.sim.callbacks.progress`).
    resume : bool
        Continue from the folder's checkpoint and ledger if it has them
        (otherwise start afresh). Without it, a folder that already holds a
        run is an error.
    callbacks : sequence of Callback or None
        More callbacks of the round loop (:mod:`dpfl.sim.callbacks`), called
        after the run's own (metrics file, checkpoint, guarantee, progress),
        e.g. :class:`~dpfl.sim.callbacks.TensorBoard` or
        :class:`~dpfl.experiments.figures.AccuracyFigure`.

    Returns
    -------
    RunResult
        Where the run is, how far it got and why it stopped.

    Raises
    ------
    DpflError
        If the folder already holds a run and ``resume`` is False, on a
        configuration the data, model or algorithm rejects (including an
        unproven analysis without ``privacy.allow_unproven`` and δ >= 1/n
        without ``privacy.allow_large_delta``), or if the saved ledger does
        not match the configuration.
    """
    import torch  # noqa: F401  (fail early with a clear import error)

    extra = check_callbacks(callbacks)
    run_dir = config.run_dir
    with rundir.run_lock(run_dir) as orphans:
        if orphans:
            log.info(
                "removed %d temporary file(s) left by an interrupted write: %s",
                len(orphans),
                ", ".join(o.name for o in orphans),
            )
        return _run_locked(config, run_dir, progress, resume, extra)


def _run_locked(
    config: RunConfig,
    run_dir: Path,
    progress: bool,
    resume: bool,
    extra: list[Callback],
) -> RunResult:
    """:func:`run` with the folder's lock held."""
    ckpt_path = run_dir / rundir.CHECKPOINT
    manifest = rundir.read_manifest(run_dir) if resume else None
    if not resume:
        rundir.check_new_folder(run_dir)
    if manifest is not None:
        # before any calibration: a changed σ, budget or sampling is refused,
        # never re-derived
        rundir.check_frozen(manifest, config.to_dict())
    elif resume:
        runfolder.check_unstarted(run_dir)

    prepared = prepare(config, started=manifest is not None)
    config = prepared.config
    if manifest is not None:
        started = runfolder.reopen_run(
            config, run_dir, manifest, prepared.dataset, prepared.algorithm
        )
    else:
        started = runfolder.start_run(config, run_dir, prepared.dataset)
    ledger = started.ledger
    trainer = build_trainer(config, prepared.algorithm, ledger, started.noise)
    execution = trainer.executor
    threads_before: int | None = None
    try:
        if manifest is not None and ckpt_path.exists():
            state = load_checkpoint(ckpt_path, run=started.run)
            try:
                trainer.load_state_dict(state["trainer"])
            except DpflError as exc:
                raise type(exc)(f"{ckpt_path}: {exc}") from None
            log.info("resuming %s at round %d", run_dir, trainer.round)
        elif manifest is not None and ledger.released:
            ledger.rewind(0)  # no checkpoint: every charged round is replayed
        if ledger.replaying and manifest is not None:
            threads_before = runfolder.replay_threads(manifest, config)
        if ledger.replaying:
            log.info(
                "the ledger holds %d rounds past the checkpoint: they are "
                "replayed and confirmed against it, not charged again",
                ledger.released - ledger.rounds,
            )
        if manifest is not None:
            # execution and ray may have changed
            rundir.write_config(run_dir, config.to_dict())
        start = getattr(execution, "start", None)
        if callable(start):  # a distributed executor: its workers, before round 1
            start(prepared.algorithm)
        return fit_run(
            config,
            run_dir,
            trainer,
            progress=progress,
            callbacks=extra,
            run=started.run,
        )
    finally:
        close = getattr(execution, "close", None)
        if callable(close):
            close()
        if threads_before is not None:
            import torch

            torch.set_num_threads(threads_before)


def fit_run(
    config: RunConfig,
    run_dir: Path,
    trainer: Trainer,
    *,
    progress: bool,
    callbacks: Sequence[Callback] = (),
    step: Callable[[], RoundReport] | None = None,
    run: str | None = None,
) -> RunResult:
    """The round loop (:meth:`Trainer.fit`) with the run folder's callbacks.

    Parameters
    ----------
    config : RunConfig
        The run, resolved (its ``rounds``, ``eval_every``, δ and name).
    run_dir : Path
        The run folder (:func:`dpfl.experiments.build.run_callbacks` write
        into it).
    trainer : Trainer
        The assembled round loop (:func:`dpfl.experiments.build.build_trainer`).
    progress : bool
        Show progress.
    callbacks : sequence of Callback
        More callbacks, after the folder's.
    step : callable or None
        Runs one round where the trainer does not (a driver that delivers
        the tasks itself, e.g. a Flower server: :meth:`Trainer.fit`'s
        ``step``).
    run : str or None
        The run digest the checkpoints carry.

    Returns
    -------
    RunResult
    """
    own, guarantee = run_callbacks(config, run_dir, progress=progress, run=run)
    fit = trainer.fit(
        config.rounds,
        eval_every=config.eval_every,
        delta=config.privacy.delta,
        callbacks=[*own, *callbacks],
        name=config.name,
        run_dir=run_dir,
        logger=log,
        step=step,
    )
    return RunResult(
        run_dir=run_dir,
        config=config,
        rounds_completed=fit.rounds_completed,
        stopped=fit.stopped,
        epsilon=fit.epsilon,
        metrics=fit.metrics,
        guarantee=guarantee.guarantee,
    )


#: Keys ``dpfl resume --set`` may change: where the client steps run, which
#: never changes what is charged (the same ledger, the same model to float
#: rounding), so a run lost with its cluster continues elsewhere. Rounds past
#: the checkpoint that must be replayed are confirmed by a digest of the
#: model, bit for bit: they need the executor they first ran on.
RESUME_KEYS = ("execution", "ray")


def resume(
    run_dir: str | Path,
    *,
    progress: bool = True,
    overrides: Sequence[str] = (),
    callbacks: Sequence[Callback] | None = None,
) -> RunResult:
    """Continue a stopped run from its checkpoint and ledger.

    Parameters
    ----------
    run_dir : str or Path
        The run folder (holding ``config.yaml``).
    progress : bool
        Show a progress bar.
    overrides : sequence of str
        ``"key=value"`` items for the keys of :data:`RESUME_KEYS` only
        (``execution``, ``ray.*``), e.g. ``"ray.address=auto"``.
    callbacks : sequence of Callback or None
        More callbacks of the round loop, as in :func:`run`.

    Returns
    -------
    RunResult
        As :func:`run`.

    Raises
    ------
    DpflError
        If the folder holds no ``config.yaml``, or an override names a key
        that would change the run.
    """
    run_dir = Path(run_dir)
    if not (run_dir / rundir.CONFIG).exists():
        raise DpflError(f"{run_dir} is not a run folder (no {rundir.CONFIG})")
    for item in overrides:
        key = item.partition("=")[0].strip()
        if key.split(".")[0] not in RESUME_KEYS:
            raise ConfigError(
                f"resume --set may change only {', '.join(RESUME_KEYS)} (where the "
                f"client steps run); got {key!r}"
            )
    tree = load_config(run_dir / rundir.CONFIG, overrides).to_dict()
    # the folder may have been moved: it is where the run lives now
    tree.update(output_dir=str(run_dir.parent), name=run_dir.name)
    config = config_from_dict(tree)
    return run(config, progress=progress, resume=True, callbacks=callbacks)
