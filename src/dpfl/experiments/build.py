"""Assemble a run: from a configuration, or from Python objects, to a trainer.

The one public way to put a run together. ``dpfl train``
(:func:`dpfl.experiments.runner.run`), :func:`dpfl.make_private` and the
Flower integration (:mod:`dpfl.integrations.flower`) all build through these
functions, so the same configuration gives each the same data, model,
algorithm, privacy plan, ledger and executor.

From a configuration (:class:`~dpfl.experiments.config.RunConfig`):

========================  =====================================================
:func:`build_dataset`     the federated data (``data``; the partition seeded by
                          ``seed``)
:func:`build_model`       the model (``model``: a built-in one or the user's
                          factory; initial weights from ``seed``)
:func:`build_loss`        the user's loss (``loss``; none: the built-in one)
:func:`resolve_device`    ``device`` (``auto``: CUDA when available)
:func:`~dpfl.experiments.privacy.resolve_privacy`
                          the privacy settings checked against the algorithm
                          and data; σ calibrated; the analysis named
:func:`build_algorithm`   the algorithm with its model, on its device
:func:`~dpfl.experiments.privacy.build_ledger`
                          the privacy ledger: budget, analysis, guard
:func:`build_executor`    what runs the client steps, found by name in
                          :mod:`dpfl.sim.executors` (``ray`` with the ``ray``
                          section)
:func:`build_trainer`     the round loop (:class:`~dpfl.sim.loop.Trainer`)
:func:`prepare`           every check a run makes before round 1, and what
                          they build (:class:`Prepared`)
:func:`run_callbacks`     the run folder's callbacks: metrics, checkpoint,
                          guarantee, progress
========================  =====================================================

From Python objects, :func:`assemble` takes a model, a
:class:`~dpfl.data.FederatedDataset`, an algorithm name with its parameters
and a target (ε, δ), and gives an :class:`Assembly`: the algorithm, its
privacy plan (:func:`dpfl.sim.plan.plan_privacy`, the planner of the
configuration path too), the ledger and the trainer.

Nothing here writes a file; a run folder is started by
:func:`dpfl.experiments.runfolder.start_run` and driven by
:func:`dpfl.experiments.runner.fit_run`.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dpfl._validate import check_count, check_delta, check_positive
from dpfl.accounting.ledger import Budget, PrivacyLedger
from dpfl.errors import DpflError, InvalidParameterError
from dpfl.experiments import rundir
from dpfl.experiments.config import RunConfig
from dpfl.experiments.guarantee import GuaranteeFile
from dpfl.experiments.model import (
    build_loss,
    build_model,
    check_model_accepts,
)
from dpfl.experiments.privacy import resolve_privacy
from dpfl.sim.callbacks import Callback, Checkpoint, MetricsFile
from dpfl.sim.callbacks import progress as progress_callback

if TYPE_CHECKING:
    from torch import nn

    from dpfl.data.dataset import FederatedDataset
    from dpfl.sim.algorithms.base import FederatedAlgorithm
    from dpfl.sim.executors import Executor
    from dpfl.sim.loop import Trainer
    from dpfl.sim.plan import PrivacyPlan

__all__ = [
    "Assembly",
    "Prepared",
    "RunNoise",
    "assemble",
    "build_algorithm",
    "build_dataset",
    "build_executor",
    "build_trainer",
    "prepare",
    "resolve_device",
    "run_callbacks",
]

log = logging.getLogger("dpfl.experiments")


# -- the parts of a configured run ----------------------------------------------
def resolve_device(name: str) -> str:
    """The torch device a run's ``device`` names.

    Parameters
    ----------
    name : str
        ``"cpu"``, ``"cuda"`` or ``"auto"`` (CUDA when available).

    Returns
    -------
    str
        ``"cpu"`` or ``"cuda"`` (or ``name`` itself for another device).

    Raises
    ------
    DpflError
        If ``"cuda"`` is asked for and CUDA is not available.
    """
    import torch

    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise DpflError("device 'cuda' was asked for but CUDA is not available")
    return name


def build_dataset(config: RunConfig) -> FederatedDataset:
    """The run's federated data (:func:`dpfl.data.get_dataset`).

    The ``data`` section's keys that are set, its ``options``, and the run's
    ``seed`` (which seeds the partition and any generated data).
    """
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
    dataset: FederatedDataset = get_dataset(data.name, **kwargs)
    return dataset


def build_algorithm(
    config: RunConfig, dataset: FederatedDataset, *, model: nn.Module | None = None
) -> FederatedAlgorithm:
    """The configured algorithm, with ``privacy.noise_multiplier`` as its σ.

    Parameters
    ----------
    config : RunConfig
        The run, resolved (σ set by
        :func:`~dpfl.experiments.privacy.resolve_privacy`; ``None`` reads
        as 0, no noise).
    dataset : FederatedDataset
        The run's data (:func:`build_dataset`).
    model : torch.nn.Module or None
        The model to train (``None``: :func:`build_model`).

    Returns
    -------
    FederatedAlgorithm
        On the configuration's device (:func:`resolve_device`), training
        with the configured loss (:func:`build_loss`).
    """
    from dpfl.sim.algorithms import build_algorithm as build

    loss = build_loss(config)
    return build(
        config.algorithm.name,
        config.algorithm.params,
        model=build_model(config, dataset) if model is None else model,
        dataset=dataset,
        noise_multiplier=config.privacy.noise_multiplier or 0.0,
        device=resolve_device(config.device),
        max_clients=config.max_clients,
        **({} if loss is None else {"loss_fn": loss}),
    )


def build_executor(config: RunConfig) -> Executor:
    """What runs the client steps: the executor ``execution`` names.

    Found by name in the executor registry (:func:`dpfl.sim.executors.executor`);
    ``execution: ray`` is set up by the ``ray`` section (Ray is imported
    only then). Close a distributed executor when the run ends (its
    ``close``).
    """
    from dpfl.sim.executors import executor

    if config.execution != "ray":
        return executor(config.execution)
    r = config.ray
    log.info(
        "execution: ray, %d worker(s) with %g CPU and %g GPU each, on %s",
        r.num_workers,
        r.num_cpus_per_worker,
        r.num_gpus_per_worker,
        "a local instance" if r.address is None else f"the cluster at {r.address}",
    )
    return executor("ray", **dataclasses.asdict(r))


@dataclasses.dataclass(frozen=True)
class RunNoise:
    """Where a run's noise comes from.

    Attributes
    ----------
    secure : bool
        Secure noise from a secret key (``privacy.secure_noise``); ``False``:
        reproducible noise from the seed.
    key : bytes or None
        The secret key (``None`` with ``secure``: the trainer makes a fresh
        one).
    stream_version : str or None
        The secure noise stream (``None``: the current one).
    """

    secure: bool
    key: bytes | None = None
    stream_version: str | None = None

    @classmethod
    def of(cls, config: RunConfig, key: bytes | None = None) -> RunNoise:
        """The noise ``config`` asks for, with ``key`` when it is secure."""
        secure = config.privacy.secure_noise
        return cls(secure, key if secure else None)


def build_trainer(
    config: RunConfig,
    algorithm: FederatedAlgorithm,
    ledger: PrivacyLedger,
    noise: RunNoise,
    *,
    execution: str | Executor | None = None,
) -> Trainer:
    """The round loop of a configured run.

    Parameters
    ----------
    config : RunConfig
        The run (its ``seed``; its ``execution`` when ``execution`` is None).
    algorithm : FederatedAlgorithm
        From :func:`build_algorithm` (or :func:`prepare`).
    ledger : PrivacyLedger
        From :func:`~dpfl.experiments.privacy.build_ledger`, or a started run's
        (:mod:`dpfl.experiments.runfolder`).
    noise : RunNoise
        Where the noise comes from.
    execution : str, Executor or None
        What runs the client steps (``None``: :func:`build_executor`).

    Returns
    -------
    Trainer
    """
    from dpfl.sim.loop import Trainer

    extra: dict[str, Any] = {}
    if noise.stream_version is not None:
        extra["stream_version"] = noise.stream_version
    return Trainer(
        algorithm,
        ledger=ledger,
        seed=config.seed,
        execution=build_executor(config) if execution is None else execution,
        secure_noise=noise.secure,
        noise_key=noise.key,
        **extra,
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
    dataset: FederatedDataset
    algorithm: FederatedAlgorithm
    parameters: int


def prepare(config: RunConfig, *, started: bool = False) -> Prepared:
    """Every check a run makes before its first round, and what it builds.

    The one validation path of ``dpfl train``, ``dpfl train --check`` and a
    Flower server: the data's files
    (:func:`~dpfl.experiments.checks.check_paths`: no FIFO or device), the
    data's size and δ >= 1/n from the configuration before anything is
    generated (:func:`~dpfl.experiments.checks.check_data_size`), the data
    read and partitioned (a missing file, a wrong column, ...), the privacy
    settings against the algorithm and the data with σ calibrated
    (:func:`~dpfl.experiments.privacy.resolve_privacy`), the model's size
    against memory and its secure noise against time
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
    dataset = build_dataset(config)
    if dataset.test_labels is None or len(dataset.test_labels) == 0:
        log.info("the data has no test set: no test loss or accuracy is reported")
    config = resolve_privacy(config, dataset, started=started)
    device = resolve_device(config.device)
    parameters = checks.check_model_size(config, dataset, device)
    model = build_model(config, dataset)
    if config.model.factory is not None or config.loss is not None:
        # the user's code: its output against the data's classes, and the
        # loss on it, in one line before anything runs
        from dpfl.models import classification_loss

        loss = config.loss
        check_model_accepts(
            model,
            dataset,
            device,
            build_loss(config) or classification_loss,
            names=(
                config.model.label,
                "the built-in loss (classification_loss)"
                if loss is None
                else f"loss.factory {loss.factory!r}",
            ),
        )
    algorithm = build_algorithm(config, dataset, model=model)
    return Prepared(config, dataset, algorithm, int(parameters))


def run_callbacks(
    config: RunConfig,
    run_dir: Path,
    *,
    progress: bool,
    run: str | None = None,
) -> tuple[list[Callback], GuaranteeFile]:
    """The callbacks that write a run folder, in their order.

    ``metrics.jsonl`` (:class:`~dpfl.sim.callbacks.MetricsFile`), the
    checkpoint every ``checkpoint_every`` rounds
    (:class:`~dpfl.sim.callbacks.Checkpoint`, carrying the run digest
    ``run``), ``guarantee.json`` at the end
    (:class:`~dpfl.experiments.guarantee.GuaranteeFile`) and, with
    ``progress``, the progress display (:func:`dpfl.sim.callbacks.progress`).

    Returns
    -------
    tuple of (list of Callback, GuaranteeFile)
        The callbacks, and the guarantee's among them (it holds what was
        written once the loop ends).
    """
    guarantee = GuaranteeFile(config)
    own: list[Callback] = [
        MetricsFile(run_dir / rundir.METRICS),
        Checkpoint(run_dir / rundir.CHECKPOINT, every=config.checkpoint_every, run=run),
        guarantee,
    ]
    if progress:
        own.append(progress_callback(desc=config.name))
    return own, guarantee


# -- from Python objects ----------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Assembly:
    """A run put together from Python objects (:func:`assemble`).

    Attributes
    ----------
    algorithm : FederatedAlgorithm
        The algorithm, holding the model.
    plan : PrivacyPlan
        σ, the event of one round, the analysis and its status.
    ledger : PrivacyLedger
        In memory, with the target budget (none without one).
    trainer : Trainer
        The round loop.
    epsilon, delta : float or None
        The target budget (``None`` for a non-private run).
    """

    algorithm: FederatedAlgorithm
    plan: PrivacyPlan
    ledger: PrivacyLedger
    trainer: Trainer
    epsilon: float | None
    delta: float | None


def assemble(
    model: nn.Module,
    data: FederatedDataset,
    algorithm: str,
    params: Mapping[str, Any],
    *,
    epsilon: float | None,
    delta: float | None,
    rounds: int,
    noise_multiplier: float | None = None,
    analysis: str | None = None,
    allow_unproven: bool = False,
    allow_large_delta: bool = False,
    seed: int = 0,
    secure_noise: bool = True,
    noise_key: bytes | None = None,
    execution: str | Executor = "batched",
    device: str = "cpu",
    loss_fn: Callable[[Any, Any], Any] | None = None,
    logger: logging.Logger | None = None,
) -> Assembly:
    """Assemble a run from a model, federated data and a target (ε, δ).

    The arguments are :func:`dpfl.make_private`'s (which documents them);
    the steps are the configuration path's: the parameters
    (:func:`dpfl.sim.algorithms.make_params`), the privacy plan
    (:func:`dpfl.sim.plan.plan_privacy`: the analysis resolved, σ
    calibrated), the algorithm, a ledger guarding the budget and the trainer.

    Returns
    -------
    Assembly

    Raises
    ------
    dpfl.errors.InvalidParameterError
        On a bad argument (named with its constraint and value), a model
        that does not accept the data, an unproven analysis without
        ``allow_unproven``, or δ >= 1/n without ``allow_large_delta``.
    dpfl.errors.DpflError
        If no noise multiplier meets the target.
    """
    import torch
    import torch.nn.functional as F

    from dpfl.data.dataset import FederatedDataset
    from dpfl.sim.algorithms import algorithm_class, make_params
    from dpfl.sim.algorithms.base import DataStats
    from dpfl.sim.algorithms.fedavg import FedAvg
    from dpfl.sim.loop import Trainer
    from dpfl.sim.plan import plan_privacy

    if not isinstance(model, torch.nn.Module):
        raise InvalidParameterError(
            f"model must be a torch.nn.Module; got {type(model).__name__}"
        )
    if not isinstance(data, FederatedDataset):
        raise InvalidParameterError(
            "data must be a dpfl.data.FederatedDataset (build one from arrays "
            "with dpfl.data.federate(features, labels, partition=..., "
            f"num_clients=...)); got {type(data).__name__}"
        )
    cls = algorithm_class(algorithm)
    rounds = check_count("rounds", rounds, minimum=1)
    seed = check_count("seed", seed, minimum=0)
    if issubclass(cls, FedAvg):
        if epsilon is not None or noise_multiplier:
            raise InvalidParameterError(
                f"algorithm {cls.name!r} adds no noise, so it cannot meet a privacy "
                f"budget; got epsilon={epsilon!r}, noise_multiplier="
                f"{noise_multiplier!r}; use a private algorithm (e.g. 'dp-fedavg') "
                "or pass epsilon=None for the non-private baseline"
            )
        noise_multiplier = 0.0
    if epsilon is not None:
        epsilon = check_positive("epsilon", epsilon)
        if noise_multiplier == 0:
            raise InvalidParameterError(
                f"noise_multiplier 0 adds no noise, so it cannot meet "
                f"epsilon={epsilon!r}; leave noise_multiplier None to calibrate it"
            )
    elif noise_multiplier is None:
        raise InvalidParameterError(
            "epsilon (a budget to calibrate the noise to) or noise_multiplier "
            "must be given; got epsilon=None, noise_multiplier=None"
        )
    if noise_multiplier != 0 or delta is not None:
        if delta is None:
            raise InvalidParameterError(
                "delta must be given for a private run (a value in (0, 1), below "
                "1/n for n privacy units); got None"
            )
        delta = check_delta("delta", delta)
    check_model_accepts(model, data, device, loss_fn)
    plan = plan_privacy(
        cls,
        make_params(cls.name, params),
        DataStats.of(data),
        epsilon=math.inf if epsilon is None else epsilon,
        delta=delta if delta is not None else 0.5,
        rounds=rounds,
        noise_multiplier=noise_multiplier,
        analysis=analysis,
        allow_unproven=allow_unproven,
        allow_large_delta=allow_large_delta,
        logger=logger or log,
    )
    alg = cls(
        plan.params,
        model=model,
        dataset=data,
        noise_multiplier=plan.noise_multiplier,
        device=device,
        loss_fn=F.cross_entropy if loss_fn is None else loss_fn,
    )
    private = plan.event is not None
    budget = (
        Budget(epsilon, delta)
        if epsilon is not None and delta is not None and private
        else None
    )
    ledger = PrivacyLedger(budget, analysis=plan.analysis)
    trainer = Trainer(
        alg,
        ledger=ledger,
        seed=seed,
        execution=execution,
        secure_noise=secure_noise,
        noise_key=noise_key,
    )
    return Assembly(
        algorithm=alg,
        plan=plan,
        ledger=ledger,
        trainer=trainer,
        epsilon=epsilon if private else None,
        delta=delta if private else None,
    )
