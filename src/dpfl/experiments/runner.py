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

The round loop is :meth:`dpfl.sim.loop.Trainer.fit`; the files above (except
``config.yaml`` and ``run.json``), the progress display and anything a
caller adds (``callbacks=``: TensorBoard,
:class:`~dpfl.sim.callbacks.AccuracyFigure`'s ``accuracy.png``, your own) are
its callbacks (:mod:`dpfl.sim.callbacks`). Progress is a bar on a terminal
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
stops with :class:`~dpfl.accounting.ledger.LedgerMismatchError` naming the
round; the ledger on disk keeps every entry throughout, so the spend is never
under-stated. A ledger without a checkpoint (a kill before the first) is
replayed from round 0. A round replays bit for bit on the same executor,
device, torch build and number of torch threads (matrix products sum in an
order that depends on the thread count): ``run.json`` records the count the
run started with and an in-process replay uses it; resuming on another kind
of machine or executor with rounds to replay stops at the first of them.

Before any work, a run (and ``dpfl train --check``) passes :func:`prepare`:
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
import json
import logging
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import yaml

from dpfl import _deadline
from dpfl._deadline import TimeLimitExceeded, time_limit
from dpfl._files import atomic_write as _atomic_write
from dpfl._files import read_jsonl
from dpfl._validate import MAX_CALIBRATED_EPSILON
from dpfl.accounting import events as ev
from dpfl.accounting import guards, schemes
from dpfl.accounting.ledger import Budget, PrivacyLedger
from dpfl.errors import BudgetExceededError, DpflError, InvalidParameterError
from dpfl.experiments import rundir
from dpfl.experiments.config import (
    ConfigError,
    RunConfig,
    config_from_dict,
    load_config,
)
from dpfl.sim.callbacks import (
    Callback,
    Checkpoint,
    FitState,
    MetricsFile,
    check_callbacks,
    load_checkpoint,
)
from dpfl.sim.callbacks import progress as progress_callback

__all__ = [
    "CALIBRATION_SECONDS",
    "CHECKPOINT",
    "CONFIG",
    "GUARANTEE",
    "LEDGER",
    "METRICS",
    "RESUME_KEYS",
    "Prepared",
    "RunResult",
    "prepare",
    "read_metrics",
    "resume",
    "run",
]

log = logging.getLogger("dpfl.experiments")

#: The longest a run's calibration of σ may take (seconds) before it is
#: refused, naming the budget: a bound on inputs no one limit catches (the
#: extreme budgets are refused at once: privacy.epsilon above
#: :data:`~dpfl._validate.MAX_CALIBRATED_EPSILON`, privacy.delta below
#: :data:`~dpfl._validate.MIN_DELTA`). Calibrations of ordinary budgets take
#: seconds to a minute or two on a laptop.
CALIBRATION_SECONDS = 600.0

CONFIG = "config.yaml"
METRICS = "metrics.jsonl"
LEDGER = "ledger.json"
CHECKPOINT = "checkpoint.pt"
GUARANTEE = "guarantee.json"


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
    path = Path(run_dir) / METRICS
    if not path.exists():
        raise DpflError(f"no {METRICS} in {run_dir}")
    return read_jsonl(path)


def _write_config(run_dir: Path, config: RunConfig) -> None:
    text = yaml.safe_dump(config.to_dict(), sort_keys=False)
    _atomic_write(run_dir / CONFIG, lambda fh: fh.write(text), binary=False)


# -- building -----------------------------------------------------------------------
def _device(name: str) -> str:
    import torch

    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise DpflError("device 'cuda' was asked for but CUDA is not available")
    return name


def _build_dataset(config: RunConfig) -> Any:
    from dpfl.data import get_dataset

    data = config.data
    kwargs: dict[str, Any] = {"num_clients": data.num_clients, "seed": config.seed}
    if data.partition is not None:
        kwargs["partition"] = data.partition
    if data.records_per_client is not None:
        kwargs["records_per_client"] = data.records_per_client
    if data.path is not None:
        kwargs["path"] = data.path
    kwargs.update(data.options)
    return get_dataset(data.name, **kwargs)


def _build_model(config: RunConfig, dataset: Any) -> Any:
    import torch

    from dpfl.models import build_model

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)
        return build_model(
            config.model.name,
            input_shape=dataset.input_shape,
            num_classes=dataset.num_classes,
            **config.model.options,
        )


def _build_algorithm(config: RunConfig, dataset: Any) -> Any:
    """The configured algorithm, with ``privacy.noise_multiplier`` as its σ."""
    from dpfl.sim.algorithms import build_algorithm

    return build_algorithm(
        config.algorithm.name,
        config.algorithm.params,
        model=_build_model(config, dataset),
        dataset=dataset,
        noise_multiplier=config.privacy.noise_multiplier or 0.0,
        device=_device(config.device),
        max_clients=config.max_clients,
    )


def _executor(config: RunConfig) -> Any:
    """What runs the client steps: a name, or a configured executor object.

    ``execution: ray`` gives a :class:`~dpfl.integrations.ray.RayExecutor`
    set up by the ``ray`` section (imported only then); the run closes it.
    """
    if config.execution != "ray":
        return config.execution
    from dpfl.integrations.ray import RayExecutor

    r = config.ray
    log.info(
        "execution: ray, %d worker(s) with %g CPU and %g GPU each, on %s",
        r.num_workers,
        r.num_cpus_per_worker,
        r.num_gpus_per_worker,
        "a local instance" if r.address is None else f"the cluster at {r.address}",
    )
    return RayExecutor(
        r.address,
        num_workers=r.num_workers,
        num_cpus_per_worker=r.num_cpus_per_worker,
        num_gpus_per_worker=r.num_gpus_per_worker,
    )


def _resolve(config: RunConfig, dataset: Any, *, started: bool = False) -> RunConfig:
    """Check the privacy settings against the algorithm; fill in analysis and σ.

    :func:`dpfl.sim.plan.plan_privacy` (shared with :func:`dpfl.make_private`)
    reads the algorithm's pure event function (``round_event``; no model is
    built). It refuses (ConfigError, one line naming the key) an analysis the
    algorithm's scheme does not offer, an unproven analysis or mechanism
    without ``privacy.allow_unproven``, and δ >= 1/n without
    ``privacy.allow_large_delta``; it calibrates σ when it is not given,
    planning for the guard that will run. Here too: a budget above
    :data:`~dpfl._validate.MAX_CALIBRATED_EPSILON` to calibrate to is refused,
    a calibration that runs past :data:`CALIBRATION_SECONDS` is refused, a
    given σ is priced for one round as the guard will price it, within
    :data:`~dpfl._deadline.ANSWER_SECONDS` (for a run that starts: a started
    one was priced when it started), and the
    accounting's own refusals (a privacy loss it cannot price) come back as
    one line naming the keys, never its internal message.
    """
    from dpfl.sim.algorithms import algorithm_class
    from dpfl.sim.algorithms.base import DataStats
    from dpfl.sim.plan import plan_privacy

    priv = config.privacy
    cls, stats = algorithm_class(config.algorithm.name), DataStats.of(dataset)
    calibrates = (
        priv.noise_multiplier is None
        and cls.resolve_noise(config.algorithm.params, stats) is None
    )
    if calibrates and priv.epsilon > MAX_CALIBRATED_EPSILON:
        raise ConfigError(
            f"privacy.epsilon must be <= {MAX_CALIBRATED_EPSILON:g} when the noise "
            "multiplier is calibrated (privacy.noise_multiplier null): past it no "
            "guarantee is left, and the noise it allows is too small to price in "
            f"bounded time; got {priv.epsilon:g}; give privacy.noise_multiplier "
            "to run under a larger budget"
        )
    target = (
        f"privacy.epsilon {priv.epsilon:g} at privacy.delta {priv.delta:g} over "
        f"{config.rounds} rounds"
    )

    def planned(sigma: float | None) -> tuple[Any, RunConfig]:
        """The plan for noise multiplier ``sigma``, and the resolved config."""
        plan = plan_privacy(
            cls,
            config.algorithm.params,
            stats,
            epsilon=priv.epsilon,
            delta=priv.delta,
            rounds=config.rounds,
            noise_multiplier=sigma,
            analysis=priv.analysis,
            guard=priv.guard,
            allow_unproven=priv.allow_unproven,
            allow_large_delta=priv.allow_large_delta,
            keys="privacy.",
            error=ConfigError,
            logger=log,
        )
        tree = config.to_dict()
        tree["algorithm"]["params"] = plan.params.to_dict()
        tree["privacy"]["noise_multiplier"] = plan.noise_multiplier
        if plan.event is not None:
            tree["privacy"]["analysis"] = (
                plan.analysis if priv.guard == "accountant" else None
            )
        return plan, config_from_dict(tree)

    def priced_in_time(plan: Any, resolved: RunConfig, given: str, fix: str) -> None:
        """Price one round as the guard will, within the answer time.

        One accounting query, as ``dpfl account`` answers one: a noise or a
        sampling so extreme that one round cannot be priced in that time
        would stall every round of the run (and every step of a
        calibration).
        """
        if plan.analysis:
            given += f", privacy.analysis {plan.analysis}"
        with time_limit(
            _deadline.ANSWER_SECONDS,
            f"one round of this run ({given}, under algorithm.params' sampling) "
            f"was not priced within {_deadline.ANSWER_SECONDS:g} s: the run would "
            f"price every round so; {fix}",
        ):
            _price_one_round(resolved, plan.event)

    try:
        if calibrates and not started:
            # one round at σ = 1 first: a calibration prices many noise
            # multipliers, and one round the accounting cannot price in time
            # would hold it for its whole time limit
            # (only its time counts: a loss the accounting cannot price at 1
            # may be priced at the calibrated noise)
            probe, probed = planned(1.0)
            if probe.event is not None:
                try:
                    priced_in_time(
                        probe,
                        probed,
                        "privacy.noise_multiplier null, priced at 1 before calibrating",
                        "use less extreme sampling probabilities",
                    )
                except TimeLimitExceeded:
                    raise
                except InvalidParameterError as exc:
                    if not _raised_in_accounting(exc):
                        raise
        with time_limit(
            CALIBRATION_SECONDS,
            f"the noise multiplier for {target} was not found within "
            f"{CALIBRATION_SECONDS:g} s (the accounting's cost grows as epsilon "
            "grows and delta shrinks); use a smaller privacy.epsilon, a larger "
            "privacy.delta, or give privacy.noise_multiplier",
        ):
            plan, resolved = planned(priv.noise_multiplier)
            if plan.event is not None and not plan.calibrated and not started:
                priced_in_time(
                    plan,
                    resolved,
                    f"privacy.noise_multiplier {priv.noise_multiplier:g}",
                    "use a larger privacy.noise_multiplier or less extreme "
                    "sampling probabilities",
                )
    except (ConfigError, TimeLimitExceeded):
        raise
    except InvalidParameterError as exc:
        # the algorithm's own checks against the data name a parameter
        # (e.g. second_stage_size); the accounting's internal refusals (a
        # privacy loss it cannot price) name the budget instead
        fields = {f.name for f in dataclasses.fields(config.algorithm.params)}
        first = str(exc).split(" ", 1)[0]
        if first in fields:
            raise ConfigError(f"algorithm.params.{exc}") from None
        if not _raised_in_accounting(exc):
            raise
        sigma = priv.noise_multiplier
        raise ConfigError(
            f"{target} "
            + ("" if sigma is None else f"with privacy.noise_multiplier {sigma:g} ")
            + "is beyond what the accounting can price for this algorithm (the "
            "privacy loss at such a small noise, or under such extreme sampling "
            "probabilities, leaves its numerical range); "
            + (
                "use a smaller privacy.epsilon or a larger privacy.delta"
                if sigma is None
                else "use a larger privacy.noise_multiplier"
            )
            + " or less extreme sampling probabilities"
        ) from None
    return resolved


def _price_one_round(config: RunConfig, event: ev.Event) -> None:
    """Price one round as the run's guard will, before the run (σ given).

    A budget that does not admit even one round is the run's to report (it
    stops at once, "budget reached"); a noise the accounting cannot price
    raises here, before any work, instead of in round 1.
    """
    from dpfl.accounting.accountant import Accountant

    ledger = _ledger(config, Path("."))
    ledger.path = None
    if ledger.budget is None:
        return
    try:
        ledger.check(event)
    except BudgetExceededError:
        # over the budget at once: the run's to report, unless no finite
        # epsilon holds at all (a loss too heavy to price), the config's
        one = Accountant(ledger.analysis).compose(event).epsilon(ledger.budget.delta)
        if math.isinf(one.upper):
            sigma = config.privacy.noise_multiplier
            raise ConfigError(
                f"privacy.noise_multiplier {sigma:g} leaves no finite epsilon for "
                "even one round (the privacy loss at such a small noise is too "
                "heavy to price); use a larger privacy.noise_multiplier"
            ) from None


def _raised_in_accounting(exc: BaseException) -> bool:
    """Whether ``exc`` was raised inside :mod:`dpfl.accounting` (its internals)."""
    tb, last = exc.__traceback__, None
    while tb is not None:
        last, tb = tb, tb.tb_next
    if last is None:
        return False
    return "/dpfl/accounting/" in last.tb_frame.f_code.co_filename.replace("\\", "/")


def _ledger(
    config: RunConfig, run_dir: Path, run: str | None = None, key: str | None = None
) -> PrivacyLedger:
    priv = config.privacy
    private = bool(priv.noise_multiplier)
    budget = (
        None
        if math.isinf(priv.epsilon) or not private
        else Budget(priv.epsilon, priv.delta)
    )
    return PrivacyLedger(
        budget,
        analysis=priv.analysis,
        path=run_dir / LEDGER,
        run=run,
        key=key,
        guard=guards.guard(priv.guard),
    )


@dataclasses.dataclass(frozen=True)
class Prepared:
    """A run's resolved configuration and what it built before its first round.

    Attributes
    ----------
    config : RunConfig
        The resolved configuration (σ calibrated, the analysis named).
    dataset : FederatedDataset
        The data, read and partitioned.
    algorithm : FederatedAlgorithm
        The algorithm with its model, on its device.
    parameters : int
        The model's parameter count.
    """

    config: RunConfig
    dataset: Any
    algorithm: Any
    parameters: int


def prepare(config: RunConfig, *, started: bool = False) -> Prepared:
    """Every check a run makes before its first round, and what it builds.

    The one validation path of ``dpfl train`` (:func:`run`) and ``dpfl train
    --check``: the data's files (:func:`~dpfl.experiments.checks.check_paths`:
    no FIFO or device), the data's size and δ >= 1/n from the configuration
    before anything is generated
    (:func:`~dpfl.experiments.checks.check_data_size`), the data read and
    partitioned (a missing file, a wrong column, ...), the privacy settings
    against the algorithm and the data (an unproven analysis without
    ``privacy.allow_unproven``, δ >= 1/n, ...) with σ calibrated
    (:func:`_resolve`: a calibration within :data:`CALIBRATION_SECONDS`, a
    given σ priced within :data:`~dpfl._deadline.ANSWER_SECONDS`), the
    model's size against memory and its secure noise against time
    (:func:`~dpfl.experiments.checks.check_model_size`), and the algorithm
    built on its device. Nothing is written.

    Parameters
    ----------
    config : RunConfig
        The run.
    started : bool
        The run is resumed (its σ was priced when it started).

    Returns
    -------
    Prepared
        The resolved configuration, the data, the algorithm.

    Raises
    ------
    DpflError
        One line naming the key, the constraint and the value.
    """
    from dpfl.experiments import checks

    checks.check_paths(config)
    checks.check_data_size(config)
    dataset = _build_dataset(config)
    if dataset.test_labels is None or len(dataset.test_labels) == 0:
        log.info("the data has no test set: no test loss or accuracy is reported")
    config = _resolve(config, dataset, started=started)
    device = _device(config.device)
    parameters = checks.check_model_size(config, dataset, device)
    algorithm = _build_algorithm(config, dataset)
    return Prepared(config, dataset, algorithm, parameters)


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
        :class:`~dpfl.sim.callbacks.AccuracyFigure`.

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
    ckpt_path = run_dir / CHECKPOINT
    ledger_path = run_dir / LEDGER
    manifest = rundir.read_manifest(run_dir) if resume else None
    if not resume:
        rundir.check_new_folder(run_dir)
    if manifest is not None:
        # before any calibration: a changed σ, budget or sampling is refused,
        # never re-derived
        rundir.check_frozen(manifest, config.to_dict())
    started = manifest is not None
    if resume and not started:
        _check_unstarted(run_dir)

    prepared = prepare(config, started=started)
    config, dataset, algorithm = prepared.config, prepared.dataset, prepared.algorithm

    from dpfl.sim.loop import Trainer

    if started:
        assert manifest is not None
        noise, key = _started_noise(config, run_dir, manifest)
        rundir.check_identity(
            manifest, run_dir, key=key, data=rundir.data_fingerprint(dataset)
        )
        run_id = manifest["run"]
        if not ledger_path.exists():
            raise DpflError(
                f"{ledger_path} is missing but {rundir.MANIFEST} says the run "
                "started: refusing to resume without its ledger (the spend is "
                "never reset)"
            )
        ledger = PrivacyLedger.load(ledger_path)
        if ledger.run != run_id or ledger.key != key:
            raise DpflError(
                f"{ledger_path} belongs to another run (its run digest or key "
                f"fingerprint differs from {rundir.MANIFEST}'s)"
            )
        _check_ledger(ledger, config)
        _check_entries(ledger, algorithm)
    else:
        run_id, ledger, noise = _start(config, run_dir, dataset)
    execution = _executor(config)
    threads_before: int | None = None
    try:
        trainer = Trainer(
            algorithm,
            ledger=ledger,
            seed=config.seed,
            execution=execution,
            **noise,
        )
        if started and ckpt_path.exists():
            state = load_checkpoint(ckpt_path, run=run_id)
            try:
                trainer.load_state_dict(state["trainer"])
            except DpflError as exc:
                raise type(exc)(f"{ckpt_path}: {exc}") from None
            log.info("resuming %s at round %d", run_dir, trainer.round)
        elif started and ledger.released:
            ledger.rewind(0)  # no checkpoint: every charged round is replayed
        if ledger.replaying and manifest is not None:
            threads_before = _replay_threads(manifest, config)
        if ledger.replaying:
            log.info(
                "the ledger holds %d rounds past the checkpoint: they are "
                "replayed and confirmed against it, not charged again",
                ledger.released - ledger.rounds,
            )
        if started:
            _write_config(run_dir, config)  # execution and ray may have changed
        start = getattr(execution, "start", None)
        if callable(start):  # a distributed executor: its workers, before round 1
            start(algorithm)
        return _loop(
            config, run_dir, trainer, progress=progress, callbacks=extra, run=run_id
        )
    finally:
        close = getattr(execution, "close", None)
        if callable(close):
            close()
        if threads_before is not None:
            import torch

            torch.set_num_threads(threads_before)


def _stream(config: RunConfig) -> str | None:
    """The secure noise stream a new run draws from (``None``: seeded noise)."""
    if not config.privacy.secure_noise:
        return None
    from dpfl.sim.secure_noise import STREAM_VERSION

    return STREAM_VERSION


def _started_noise(
    config: RunConfig, run_dir: Path, manifest: dict[str, Any]
) -> tuple[dict[str, Any], str | None]:
    """A started run's noise arguments and key fingerprint.

    The key from its key file (:func:`~dpfl.experiments.rundir.read_run_key`),
    the stream it recorded when it started
    (:func:`~dpfl.experiments.rundir.recorded_stream`: an older stream
    included, so that it draws what the uninterrupted run drew).
    """
    if not config.privacy.secure_noise:
        return {"secure_noise": False}, None
    from dpfl.sim.secure_noise import STREAM_VERSIONS

    stream = rundir.recorded_stream(manifest, run_dir, STREAM_VERSIONS)
    key = rundir.read_run_key(run_dir)
    return {"noise_key": key, "stream_version": stream}, rundir.key_fingerprint(key)


def _start(
    config: RunConfig, run_dir: Path, dataset: Any
) -> tuple[str, PrivacyLedger, dict[str, Any]]:
    """Start a run in an empty folder: its key, identity, ledger and files.

    The run makes its own secret key (never one found in the folder), then
    writes ``config.yaml``, the empty ledger and ``run.json`` (in that order:
    a folder with ``run.json`` has the others). Returns the run digest, the
    ledger and the Trainer's noise arguments.
    """
    rundir.check_new_folder(run_dir)
    stream = _stream(config)
    if stream is not None:
        key_bytes = rundir.create_run_key(run_dir)
        noise: dict[str, Any] = {"noise_key": key_bytes, "stream_version": stream}
        key: str | None = rundir.key_fingerprint(key_bytes)
    else:
        noise, key = {"secure_noise": False}, None
    identity = {
        "key": key,
        "data": rundir.data_fingerprint(dataset),
        "stream_version": stream,
    }
    run_id = rundir.run_digest(config.to_dict(), **identity)
    ledger = _ledger(config, run_dir, run=run_id, key=key)
    _start_files(run_dir, config, ledger, identity)
    return run_id, ledger, noise


def _replay_threads(manifest: dict[str, Any], config: RunConfig) -> int | None:
    """Compute with the torch thread count the run started with; the old count.

    A replayed round must reproduce the model it released bit for bit, and a
    matrix product's sum order depends on the thread count; a resume under
    another count (``OMP_NUM_THREADS``, another machine of the same kind)
    would stop at the first replayed round. In-process executions only (a
    distributed executor's workers set their own).
    """
    import torch

    threads = manifest.get("torch_threads")
    if config.execution == "ray" or not isinstance(threads, int) or threads < 1:
        return None
    before = torch.get_num_threads()
    if before != threads:
        log.info(
            "replaying with %d torch thread(s), as the run started (this process "
            "had %d)",
            threads,
            before,
        )
        torch.set_num_threads(threads)
    return before


def _start_files(
    run_dir: Path, config: RunConfig, ledger: PrivacyLedger, identity: dict[str, Any]
) -> None:
    """A starting run's files, in this order: config, empty ledger, manifest.

    ``run.json`` comes last: a folder that has it has the other two, so a
    missing ledger beside it was deleted (see :func:`_check_unstarted`).
    """
    import torch

    _write_config(run_dir, config)
    ledger.save()
    rundir.write_manifest(
        run_dir, config.to_dict(), torch_threads=torch.get_num_threads(), **identity
    )


def _check_unstarted(run_dir: Path) -> None:
    """Resuming a folder without ``run.json``: only a run that never began.

    A run writes its key, ``config.yaml``, then an empty ledger, then
    ``run.json`` before its first round; a kill between them leaves at most a
    key and an empty ledger, which nothing was released with: both are
    removed and the run starts afresh, with a new key. Anything more without
    ``run.json`` is refused.
    """
    if (run_dir / CHECKPOINT).exists():
        raise DpflError(
            f"{run_dir} has a checkpoint but no {rundir.MANIFEST}: it was deleted "
            "or the run was written by an older dpfl; refusing to resume it"
        )
    if (run_dir / LEDGER).exists():
        ledger = PrivacyLedger.load(run_dir / LEDGER)
        if ledger.released:
            raise DpflError(
                f"{run_dir} has a ledger with {ledger.released} charged rounds but "
                f"no {rundir.MANIFEST}: it was deleted or the run was written by "
                "an older dpfl; refusing to resume it"
            )
        (run_dir / LEDGER).unlink()
    (run_dir / rundir.KEY_FILE).unlink(missing_ok=True)


def _check_entries(ledger: PrivacyLedger, algorithm: Any) -> None:
    """Each entry must be what the frozen configuration's algorithm charges.

    An entry whose event differs (e.g. a raised σ) is refused. Where the
    algorithm realises its event during the round (LOCKS), the noise
    multipliers must match.
    """
    from dpfl.sim.algorithms.base import FederatedAlgorithm

    realised = type(algorithm).realised_event is not FederatedAlgorithm.realised_event
    entries = ledger.released_ledger().entries
    for i, entry in enumerate(entries):
        want = algorithm.event(entry.round)
        have, expect = (
            ev.event_to_dict(entry.event),
            (None if want is None else ev.event_to_dict(want)),
        )
        same = (
            _noise_levels(have) == _noise_levels(expect)
            if realised and expect is not None
            else have == expect
        )
        if not same:
            raise DpflError(
                f"ledger entry {i + 1} (round {entry.round + 1}) charges {have}, "
                f"not what the run's algorithm charges ({expect}): the ledger was "
                "altered or belongs to another configuration; refusing it"
            )


def _noise_levels(tree: Any) -> list[float]:
    """Every noise multiplier in an event's dict form."""
    if isinstance(tree, dict):
        out = [float(v) for k, v in tree.items() if k == "noise_multiplier"]
        for v in tree.values():
            out += _noise_levels(v)
        return sorted(out)
    return []


def _check_ledger(ledger: PrivacyLedger, config: RunConfig) -> None:
    priv = config.privacy
    budget = ledger.budget
    analysis = priv.analysis or guards.guard(priv.guard).analysis
    unbudgeted = math.isinf(priv.epsilon) or not priv.noise_multiplier
    same_budget = (budget is None and unbudgeted) or (
        budget is not None
        and budget.epsilon == priv.epsilon
        and budget.delta == priv.delta
    )
    if ledger.analysis != analysis or ledger.guard != priv.guard or not same_budget:
        raise DpflError(
            f"the saved ledger (analysis {ledger.analysis!r}, guard "
            f"{ledger.guard!r}, budget {budget}) does not match the configuration "
            f"(analysis {analysis!r}, guard {priv.guard!r}, epsilon="
            f"{priv.epsilon}, delta={priv.delta})"
        )


def _guarantee(
    ledger: PrivacyLedger,
    event: ev.Event | None,
    delta: float,
    config: RunConfig,
    stats: Any,
) -> dict[str, Any]:
    """What the run's privacy amounts to: ``guarantee.json``.

    The ledger's summary (worst-off unit's ε under the run's analysis, with
    every term, and the proven ε beside an unproven one), the figure of
    every other analysis the scheme offers, each with its status and
    adversary (e.g. LOCKS: the server and the model observer), and under
    ``"paper"`` the paper's own figures with their caveats, where the
    algorithm states them.
    """
    if event is None:
        return {
            "private": False,
            "note": "no noise was added: the run has no privacy guarantee",
        }
    out: dict[str, Any] = {"private": True, **ledger.summary(delta)}
    from dpfl.sim.keys import noise_label

    out["noise"] = noise_label(config.privacy.secure_noise)
    if not ledger.rounds:
        return out
    from dpfl.sim.algorithms import algorithm_class

    cls = algorithm_class(config.algorithm.name)
    # Analyses that do not describe the mechanism run (e.g. participation made
    # visible to the server) are left out rather than reported beside it.
    valid = cls.valid_analyses(config.algorithm.params)
    scheme = schemes.scheme_of(event)
    analyses: dict[str, Any] = {}
    for a in scheme.analyses:
        if valid is not None and a.name not in valid:
            continue
        try:
            bound = ledger.epsilon(delta, analysis=a.name)
        except DpflError:  # an analysis the accountant cannot price (RDP)
            continue
        analyses[a.name] = {
            "epsilon": bound.upper,
            "status": a.status,
            "neighbouring": a.neighbouring or scheme.neighbouring,
            "adversary": a.adversary or scheme.adversary,
        }
    out["analyses"] = analyses
    try:
        paper = cls.paper_report(
            config.algorithm.params,
            stats,
            float(config.privacy.noise_multiplier or 0.0),
            ledger,
            delta,
        )
    except DpflError as exc:
        paper = {"error": str(exc)}
    if paper is not None:
        out["paper"] = json.loads(json.dumps(paper, default=_json_default))
    return out


def _json_default(value: Any) -> Any:
    """JSON for the values reports hold (dataclasses, arrays, bounds)."""
    if hasattr(value, "to_json"):
        return value.to_json()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if hasattr(value, "tolist"):
        return value.tolist()
    return str(value)


class _GuaranteeFile(Callback):
    """Write ``guarantee.json`` when the loop ends (not after an error)."""

    def __init__(self, config: RunConfig) -> None:
        self.config = config
        self.guarantee: dict[str, Any] = {}

    def on_fit_end(self, state: FitState) -> None:
        if state.error is not None:
            return
        trainer = state.trainer
        self.guarantee = _guarantee(
            trainer.ledger.released_ledger(),
            trainer.algorithm.event(),
            self.config.privacy.delta,
            self.config,
            trainer.algorithm.stats,
        )
        text = json.dumps(self.guarantee, indent=1, default=str)
        path = state.run_dir or self.config.run_dir
        _atomic_write(path / GUARANTEE, lambda fh: fh.write(text), binary=False)


def _loop(
    config: RunConfig,
    run_dir: Path,
    trainer: Any,
    *,
    progress: bool,
    callbacks: Sequence[Callback] = (),
    step: Callable[[], Any] | None = None,
    run: str | None = None,
) -> RunResult:
    """The round loop (:meth:`Trainer.fit`) with the run folder's callbacks.

    ``step`` runs one round where the trainer does not (a driver that
    delivers the tasks itself, :meth:`Trainer.fit`'s ``step``).
    """
    guarantee = _GuaranteeFile(config)
    own: list[Callback] = [
        MetricsFile(run_dir / METRICS),
        Checkpoint(run_dir / CHECKPOINT, every=config.checkpoint_every, run=run),
        guarantee,
    ]
    if progress:
        own.append(progress_callback(desc=config.name))
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
    if not (run_dir / CONFIG).exists():
        raise DpflError(f"{run_dir} is not a run folder (no {CONFIG})")
    for item in overrides:
        key = item.partition("=")[0].strip()
        if key.split(".")[0] not in RESUME_KEYS:
            raise ConfigError(
                f"resume --set may change only {', '.join(RESUME_KEYS)} (where the "
                f"client steps run); got {key!r}"
            )
    tree = load_config(run_dir / CONFIG, overrides).to_dict()
    # the folder may have been moved: it is where the run lives now
    tree.update(output_dir=str(run_dir.parent), name=run_dir.name)
    config = config_from_dict(tree)
    return run(config, progress=progress, resume=True, callbacks=callbacks)
