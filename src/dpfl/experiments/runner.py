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
    The privacy ledger, saved by the trainer after every charged round.
``checkpoint.pt``
    Trainer state (model, momentum, round, seed), written atomically every
    ``checkpoint_every`` rounds, on Ctrl-C, on a budget stop and at the end.
``guarantee.json``
    What the run's privacy amounts to at the end: ε of the worst-off privacy
    unit at the budget's δ, with the unit, neighbouring relation, adversary,
    analysis and its status; beside an unproven analysis, the proven ε; and
    every other analysis of the scheme with its status.

The command line (``dpfl train``) adds ``accuracy.png``: accuracy against
rounds and against ε spent (the runner itself draws nothing).

The run stops cleanly when the ledger's guard refuses a round
(:class:`~dpfl.errors.BudgetExceededError`): "budget reached at round k".
Ctrl-C finishes the current round, saves a checkpoint and the ledger, and
returns (a second Ctrl-C aborts at once). :func:`resume` continues a stopped
run exactly: same final model and ledger as an uninterrupted run.

A note on the ledger and checkpoints. The trainer saves the ledger after every
round, checkpoints are less frequent, so a run killed between two checkpoints
resumes from the older checkpoint with a ledger that already holds the later
rounds; those rounds are re-run and charged *again*. This over-states the
spend (never under-states it). A clean stop (Ctrl-C,
budget, end) always checkpoints at the ledger's round, and then the resumed
ledger equals the uninterrupted one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import os
import signal
import tempfile
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import yaml

from dpfl.accounting import events as ev
from dpfl.accounting import schemes
from dpfl.accounting.calibrate import calibrate_noise_multiplier
from dpfl.accounting.ledger import Budget, PrivacyLedger, ledger_class
from dpfl.errors import BudgetExceededError, DpflError
from dpfl.experiments.config import (
    ConfigError,
    RunConfig,
    config_from_dict,
    load_config,
)

__all__ = [
    "CHECKPOINT",
    "CONFIG",
    "GUARANTEE",
    "LEDGER",
    "METRICS",
    "RESUME_KEYS",
    "RunResult",
    "read_metrics",
    "resume",
    "run",
]

log = logging.getLogger("dpfl.experiments")

CONFIG = "config.yaml"
METRICS = "metrics.jsonl"
LEDGER = "ledger.json"
CHECKPOINT = "checkpoint.pt"
GUARANTEE = "guarantee.json"
_CKPT_FORMAT = 1
_UMASK = os.umask(0o022)
os.umask(_UMASK)


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
        ``"completed"``, ``"budget"`` (the guard refused the next round) or
        ``"interrupted"`` (Ctrl-C).
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
def _atomic_write(path: Path, write: Callable[[Any], None], *, binary: bool) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp makes 0600; use the usual mode
        with os.fdopen(fd, "wb" if binary else "w") as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


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
    out = []
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


def _truncate_metrics(run_dir: Path, rounds: int) -> None:
    """Keep only records with ``round <= rounds`` (no duplicates after resume)."""
    path = run_dir / METRICS
    if not path.exists():
        return
    kept = [r for r in read_metrics(run_dir) if int(r.get("round", 0)) <= rounds]
    text = "".join(json.dumps(r) + "\n" for r in kept)
    _atomic_write(path, lambda fh: fh.write(text), binary=False)


def _save_checkpoint(run_dir: Path, trainer: Any, ledger: PrivacyLedger) -> None:
    import torch

    # Ledger first: the ledger on disk never holds fewer rounds than the
    # checkpoint (Trainer.load_state_dict refuses that case).
    ledger.save()
    state = {
        "format": _CKPT_FORMAT,
        "round": trainer.round,
        "trainer": trainer.state_dict(),
    }
    _atomic_write(run_dir / CHECKPOINT, lambda fh: torch.save(state, fh), binary=True)


def _write_config(run_dir: Path, config: RunConfig) -> None:
    text = yaml.safe_dump(config.to_dict(), sort_keys=False)
    _atomic_write(run_dir / CONFIG, lambda fh: fh.write(text), binary=False)


# -- Ctrl-C -----------------------------------------------------------------------
@contextlib.contextmanager
def _deferred_interrupt() -> Iterator[dict[str, bool]]:
    """First SIGINT sets a flag (checked between rounds); a second one aborts."""
    flag = {"stop": False}
    if threading.current_thread() is not threading.main_thread():
        yield flag
        return
    previous = signal.getsignal(signal.SIGINT)

    def handler(signum: int, frame: Any) -> None:
        if flag["stop"]:
            signal.signal(signal.SIGINT, signal.default_int_handler)
            raise KeyboardInterrupt
        flag["stop"] = True
        log.warning("interrupt: finishing this round, then saving a checkpoint")

    signal.signal(signal.SIGINT, handler)
    try:
        yield flag
    finally:
        signal.signal(signal.SIGINT, previous)


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


def _units(event: ev.Event, dataset: Any) -> tuple[str, int]:
    """The privacy unit of ``event`` and how many of them the data holds."""
    unit = schemes.scheme_of(event).unit
    if unit == "client":
        return "clients", int(dataset.num_clients)
    return "records", int(dataset.client_sizes().sum())


def _resolve(config: RunConfig, dataset: Any) -> RunConfig:
    """Check the privacy settings against the algorithm; fill in analysis and σ.

    Everything here reads the algorithm's pure event function
    (``round_event``): no model is built. Refuses (ConfigError, one line
    naming the key) an analysis the algorithm's scheme does not offer, an
    unproven analysis or mechanism without ``privacy.allow_unproven``, and
    δ >= 1/n without ``privacy.allow_large_delta``; calibrates σ when it is
    not given (:func:`dpfl.accounting.calibrate.calibrate_noise_multiplier`,
    planning for the guard that will run).
    """
    from dpfl.sim.algorithms import algorithm_class
    from dpfl.sim.algorithms.base import DataStats

    cls = algorithm_class(config.algorithm.name)
    params = config.algorithm.params
    stats = DataStats.of(dataset)
    priv = config.privacy
    own = cls.resolve_noise(params, stats)
    if own is not None:
        if priv.noise_multiplier is not None:
            raise ConfigError(
                "the algorithm's parameters set the noise multiplier themselves "
                f"({own[0]:.4g}); leave privacy.noise_multiplier null; got "
                f"{priv.noise_multiplier!r}"
            )
        sigma_own, params = own
        log.info("noise multiplier %.4f from the algorithm's parameters", sigma_own)
        tree = config.to_dict()
        tree["algorithm"]["params"] = params.to_dict()
        tree["privacy"]["noise_multiplier"] = sigma_own
        config = config_from_dict(tree)
        priv = config.privacy
    if priv.noise_multiplier == 0:
        log.info("privacy.noise_multiplier is 0: a NON-PRIVATE run (no noise)")
        return config
    event = cls.round_event(params, stats, priv.noise_multiplier or 1.0)
    if priv.guard == "accountant":
        analysis = schemes.resolve_analysis(event, priv.analysis)
    else:
        analysis = ledger_class(priv.guard).rule  # type: ignore[attr-defined]
    info = schemes.scheme_of(event).analysis(analysis)
    reasons = []
    if not info.valid:
        reasons.append(
            f"privacy.analysis {analysis!r} is not a proven bound ({info.status}: "
            f"{info.basis})"
        )
    unproven = cls.unproven_reason(params)
    if unproven:
        reasons.append(unproven)
    if reasons and not priv.allow_unproven:
        raise ConfigError(
            f"{reasons[0]}; set privacy.allow_unproven: true to run anyway (every "
            "epsilon is then labelled as not a proven bound, beside the proven one)"
        )
    what, n = _units(event, dataset)
    if priv.delta >= 1.0 / n and not priv.allow_large_delta:
        raise ConfigError(
            f"privacy.delta must be < 1/n = {1.0 / n:.3g} for the n = {n} {what} "
            "this run protects (a delta that large allows releasing one of them "
            f"outright with probability delta); got {priv.delta!r}; set "
            "privacy.allow_large_delta: true to accept it"
        )
    sigma = priv.noise_multiplier
    if sigma is None:
        log.info(
            "calibrating the noise multiplier to (epsilon=%g, delta=%g) over %d "
            "rounds under the %r analysis",
            priv.epsilon,
            priv.delta,
            config.rounds,
            analysis,
        )
        sigma = calibrate_noise_multiplier(
            lambda s: cls.round_event(params, stats, s),
            epsilon=priv.epsilon,
            delta=priv.delta,
            rounds=config.rounds,
            analysis=analysis,
            population=stats.num_clients,
            bound_tolerance=PrivacyLedger(analysis=analysis).tolerance,
            tolerance=2e-3,
        )
        log.info("noise multiplier: %.4f", sigma)
    keep = None if priv.guard != "accountant" else analysis
    return _with_privacy(config, noise_multiplier=sigma, analysis=keep)


def _with_privacy(config: RunConfig, **changes: Any) -> RunConfig:
    tree = config.to_dict()
    tree["privacy"].update(changes)
    return config_from_dict(tree)


def _ledger(config: RunConfig, run_dir: Path) -> PrivacyLedger:
    priv = config.privacy
    private = bool(priv.noise_multiplier)
    budget = (
        None
        if math.isinf(priv.epsilon) or not private
        else Budget(priv.epsilon, priv.delta)
    )
    return ledger_class(priv.guard)(
        budget, analysis=priv.analysis, path=run_dir / LEDGER
    )


# -- the run ------------------------------------------------------------------------
def run(config: RunConfig, *, progress: bool = True, resume: bool = False) -> RunResult:
    """Run an experiment (or continue one) and write its folder.

    Parameters
    ----------
    config : RunConfig
        The experiment. A ``noise_multiplier`` of ``None`` is calibrated so that
        ``rounds`` rounds fit the budget
        (:func:`dpfl.accounting.calibrate.calibrate_noise_multiplier`); 0 runs
        without noise (non-private).
    progress : bool
        Show a progress bar (round, test loss and accuracy, ε spent).
    resume : bool
        Continue from the folder's checkpoint and ledger if it has them
        (otherwise start afresh). Without it, a folder that already holds a
        run is an error.

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

    run_dir = config.run_dir
    ckpt_path = run_dir / CHECKPOINT
    ledger_path = run_dir / LEDGER
    if not resume and (ckpt_path.exists() or ledger_path.exists()):
        raise DpflError(
            f"{run_dir} already holds a run; continue it with `dpfl resume "
            f"{run_dir}` or choose another name (--set name=...)"
        )
    run_dir.mkdir(parents=True, exist_ok=True)

    dataset = _build_dataset(config)
    config = _resolve(config, dataset)
    algorithm = _build_algorithm(config, dataset)

    from dpfl.sim.loop import Trainer

    if resume and ledger_path.exists():
        ledger = PrivacyLedger.load(ledger_path)
        _check_ledger(ledger, config)
    else:
        ledger = _ledger(config, run_dir)
    execution = _executor(config)
    try:
        trainer = Trainer(
            algorithm, ledger=ledger, seed=config.seed, execution=execution
        )
        if resume and ckpt_path.exists():
            import torch

            state = torch.load(ckpt_path, map_location="cpu", weights_only=True)
            if not isinstance(state, dict) or state.get("format") != _CKPT_FORMAT:
                raise DpflError(f"{ckpt_path} is not a dpfl run checkpoint")
            trainer.load_state_dict(state["trainer"])
            if ledger.rounds > trainer.round:
                log.warning(
                    "the ledger holds %d charged rounds, the checkpoint %d: rounds "
                    "%d..%d are re-run and charged again (the spend is over-stated, "
                    "never reset)",
                    ledger.rounds,
                    trainer.round,
                    trainer.round + 1,
                    ledger.rounds,
                )
            log.info("resuming %s at round %d", run_dir, trainer.round)
        elif resume and ledger.rounds:
            log.warning(
                "no checkpoint but the ledger holds %d rounds: starting again at round "
                "0 with that spend kept",
                ledger.rounds,
            )
        _truncate_metrics(run_dir, trainer.round)
        _write_config(run_dir, config)
        start = getattr(execution, "start", None)
        if callable(start):  # a distributed executor: its workers, before round 1
            start(algorithm)
        return _loop(config, run_dir, trainer, progress=progress)
    finally:
        close = getattr(execution, "close", None)
        if callable(close):
            close()


def _check_ledger(ledger: PrivacyLedger, config: RunConfig) -> None:
    priv = config.privacy
    budget = ledger.budget
    analysis = (
        priv.analysis if priv.guard == "accountant" else ledger_class(priv.guard).rule  # type: ignore[attr-defined]
    )
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
    if not ledger.rounds:
        return out
    scheme = schemes.scheme_of(event)
    analyses: dict[str, Any] = {}
    for a in scheme.analyses:
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
    from dpfl.sim.algorithms import algorithm_class

    cls = algorithm_class(config.algorithm.name)
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


def _loop(
    config: RunConfig, run_dir: Path, trainer: Any, *, progress: bool
) -> RunResult:
    from tqdm.auto import tqdm

    event = trainer.algorithm.event()
    private = event is not None
    ledger: PrivacyLedger = trainer.ledger
    status = schemes.describe(event, ledger.analysis)["status"] if private else None
    default = schemes.scheme_of(event).default if private else None
    stopped = "completed"
    last_eval: dict[str, float] = {}
    spent: float | None = None
    proven: float | None = None
    last_ckpt = trainer.round if (run_dir / CHECKPOINT).exists() else -1

    def evaluate() -> dict[str, Any]:
        nonlocal last_eval, spent, proven
        last_eval = {k: float(v) for k, v in trainer.algorithm.evaluate().items()}
        out: dict[str, Any] = dict(last_eval)
        if not private:
            out["epsilon"] = None
            out["private"] = False
            return out
        delta = config.privacy.delta
        spent = float(ledger.epsilon(delta).upper) if ledger.rounds else 0.0
        out["epsilon"] = spent
        if status != "proven":
            # an unproven figure never travels without the proven one
            proven = (
                float(ledger.epsilon(delta, analysis=default).upper)
                if ledger.rounds
                else 0.0
            )
            out["epsilon_status"] = status
            out["epsilon_proven"] = proven
        return out

    bar = tqdm(
        total=config.rounds,
        initial=trainer.round,
        disable=not progress,
        unit="round",
        desc=config.name,
        dynamic_ncols=True,
    )
    metrics_file = (run_dir / METRICS).open("a")
    try:
        with _deferred_interrupt() as flag:
            while trainer.round < config.rounds:
                try:
                    report = trainer.step()
                except BudgetExceededError as exc:
                    stopped = "budget"
                    log.warning(
                        "budget reached at round %d: %s", trainer.round + 1, exc
                    )
                    break
                done = report.round + 1
                record: dict[str, Any] = {"round": done}
                record.update({k: float(v) for k, v in report.metrics.items()})
                if done % config.eval_every == 0 or done == config.rounds:
                    record.update(evaluate())
                    bar.set_postfix(
                        _postfix(last_eval, spent, private, status, proven),
                        refresh=False,
                    )
                metrics_file.write(json.dumps(record) + "\n")
                metrics_file.flush()
                bar.update(1)
                if done % config.checkpoint_every == 0:
                    _save_checkpoint(run_dir, trainer, ledger)
                    last_ckpt = done
                if flag["stop"]:
                    stopped = "interrupted"
                    log.warning("interrupted after round %d; checkpoint saved", done)
                    break
        if (
            stopped != "completed"
            and trainer.round
            and (trainer.round % config.eval_every)
        ):
            # a final evaluation of the model the run ends with
            record = {"round": trainer.round, **evaluate()}
            _replace_last(metrics_file, run_dir, record)
        if last_ckpt != trainer.round:
            _save_checkpoint(run_dir, trainer, ledger)
        else:
            ledger.save()
    finally:
        metrics_file.close()
        bar.close()
    if not last_eval and trainer.round:
        evaluate()
    guarantee = _guarantee(
        ledger, event, config.privacy.delta, config, trainer.algorithm.stats
    )
    text = json.dumps(guarantee, indent=1, default=str)
    _atomic_write(run_dir / GUARANTEE, lambda fh: fh.write(text), binary=False)
    return RunResult(
        run_dir=run_dir,
        config=config,
        rounds_completed=trainer.round,
        stopped=stopped,
        epsilon=spent if private else None,
        metrics=last_eval,
        guarantee=guarantee,
    )


def _replace_last(fh: Any, run_dir: Path, record: dict[str, Any]) -> None:
    """Merge ``record`` into the metrics line of the same round (written last)."""
    fh.flush()
    rows = read_metrics(run_dir)
    if rows and rows[-1].get("round") == record["round"]:
        rows[-1].update(record)
    else:
        rows.append(record)
    text = "".join(json.dumps(r) + "\n" for r in rows)
    fh.seek(0)
    fh.truncate()
    fh.write(text)
    fh.flush()


def _postfix(
    metrics: dict[str, float],
    spent: float | None,
    private: bool,
    status: str | None,
    proven: float | None,
) -> dict[str, str]:
    out = {}
    if "test_loss" in metrics:
        out["loss"] = f"{metrics['test_loss']:.3f}"
    if "test_accuracy" in metrics:
        out["acc"] = f"{metrics['test_accuracy']:.3f}"
    if not private:
        out["eps"] = "none (non-private)"
    elif status != "proven":
        out["eps"] = f"{spent:.3g} ({status}, not a bound)"
        out["proven eps"] = f"{proven:.3g}"
    else:
        out["eps"] = f"{spent:.3g}"
    return out


#: Keys ``dpfl resume --set`` may change: where the client steps run, which
#: never changes the result (the same ledger, the same model to float
#: rounding), so a run lost with its cluster continues elsewhere.
RESUME_KEYS = ("execution", "ray")


def resume(
    run_dir: str | Path, *, progress: bool = True, overrides: Sequence[str] = ()
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
    return run(config, progress=progress, resume=True)
