"""Run configuration: one frozen dataclass tree, read from YAML, overridden by flags.

A run is described by a :class:`RunConfig` whose sections are
:class:`DataConfig`, :class:`ModelConfig`, :class:`LossConfig` (optional),
:class:`AlgorithmConfig`, :class:`PrivacyConfig` and :class:`RayConfig`.
:func:`load_config` reads a YAML file, applies ``--set key.sub=value``
overrides (values parsed as YAML, so ``0.5`` is a float, ``null`` is ``None``
and ``[64, 32]`` a list) and validates the result; :meth:`RunConfig.to_dict`
gives back plain data for writing the resolved configuration of a run.

Every error names the dotted key and the value found: an unknown key comes with
the closest known key (``difflib``), a wrong type with the expected type, an
out-of-range value with the allowed range. Errors are
:class:`ConfigError`, a :class:`~dpfl.errors.InvalidParameterError`, so the
command line prints them as one line and exits with status 2.

Examples
--------
>>> cfg = config_from_dict(
...     {"name": "demo", "rounds": 5, "privacy": {"epsilon": 4.0, "delta": 1e-5}},
...     overrides=["algorithm.params.learning_rate=0.5"],
... )
>>> cfg.algorithm.params.learning_rate, cfg.privacy.noise_multiplier is None
(0.5, True)
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from dpfl._validate import (
    MAX_ROUNDS,
    MAX_SEED,
    shown,
)
from dpfl.accounting.guards import GUARDS as LEDGER_GUARDS
from dpfl.accounting.schemes import all_analyses
from dpfl.errors import InvalidParameterError
from dpfl.experiments.config_ranges import (
    address_problem,
    delta_problem,
    directory_problem,
    epsilon_problem,
    name_problem,
    noise_problem,
)
from dpfl.experiments.config_schema import (
    ConfigError,
    at_least,
    between,
    build_section,
    check_numbers,
    check_options,
    field,
    finite_nonnegative,
    finite_positive,
    one_of,
)
from dpfl.experiments.config_yaml import apply_overrides, read_config_file
from dpfl.experiments.factory import check_factory_options, load_factory
from dpfl.sim.executors import EXECUTION_NAMES

__all__ = [
    "AlgorithmConfig",
    "ConfigError",
    "DataConfig",
    "LossConfig",
    "ModelConfig",
    "PrivacyConfig",
    "RayConfig",
    "RunConfig",
    "config_from_dict",
    "load_config",
]

GUARDS = tuple(LEDGER_GUARDS)
_DEVICES = ("cpu", "cuda", "auto")


# -- the tree -------------------------------------------------------------------
#: Data set names read from a user's file given by ``data.path``.
FILE_DATASETS = ("csv", "npz", "idx")


@dataclasses.dataclass(frozen=True)
class DataConfig:
    """The federated data set.

    Attributes
    ----------
    name : str
        A name of :func:`dpfl.data.get_dataset` (``"digits"`` by default), or
        ``"csv"``, ``"npz"`` or ``"idx"`` for a file of one's own.
    path : str or None
        The file (or, for ``"idx"``, the directory of IDX files) of a
        ``csv``/``npz``/``idx`` data set; a relative path is taken from the
        working directory. Required for those names, refused for the others
        (the real data sets take ``options.root``).
    num_clients : int or None
        Number of clients; with ``partition: natural``, how many of the data's
        own clients to draw at random, or ``None`` for all of them.
    partition : str or None
        ``"equal-size"`` (d records each, the random-participation setting),
        ``"iid"``, ``"shards"``, ``"dirichlet"``, ``"natural"`` (the clients
        the data come with: a CSV client column, an npz client array,
        FEMNIST's writers), ...; ``None`` for data sets that are generated
        federated (``"synthetic"``).
    records_per_client : int or None
        d, for ``"equal-size"``.
    options : dict
        Further keyword arguments of :func:`~dpfl.data.get_dataset`
        (e.g. ``beta``, ``test_fraction``; for a CSV file ``label_column``,
        ``client_column``, ``feature_columns``, ``header``, ``delimiter``,
        ``test_path``, ``test_fraction``; for npz the array names
        ``features``, ``labels``, ``test_features``, ``test_labels``,
        ``clients``; for IDX ``labels``, ``test_images``, ``test_labels``).
    """

    name: str = "digits"
    path: str | None = None
    num_clients: int | None = field(100, at_least(1))
    partition: str | None = "equal-size"
    records_per_client: int | None = field(None, at_least(1))
    options: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.name in FILE_DATASETS and not self.path:
            raise ConfigError(
                f"data.path is required for data.name {shown(self.name)} (the file to "
                "read); got None"
            )
        if self.path is not None and self.name not in FILE_DATASETS:
            raise ConfigError(
                f"data.path is read only for data.name in {list(FILE_DATASETS)}; "
                f"got data.name {shown(self.name)} (a real data set's directory is "
                "data.options.root)"
            )
        if self.num_clients is None and self.partition != "natural":
            raise ConfigError(
                "data.num_clients may be null only with data.partition "
                f"'natural' (all of the data's own clients); got partition "
                f"{shown(self.partition)}"
            )
        from dpfl.data.registry import dataset_options

        schema = dataset_options(self.name)
        if schema is not None:  # an unknown name: get_dataset lists the names
            # what the runner passes itself (a section key left null passes
            # nothing, and its option is then the one value)
            given = {
                "num_clients": "data.num_clients",
                "seed": "seed (the run's seed seeds the data)",
                "partition": "data.partition",
                "records_per_client": "data.records_per_client",
                "path": "data.path",
            }
            given = {
                k: v
                for k, v in given.items()
                if k in ("num_clients", "seed") or getattr(self, k) is not None
            }
            checked = check_options("data.options", self.options, schema, given)
            object.__setattr__(self, "options", checked)
            missing = [
                k
                for k, (_, required) in schema.items()
                if required and k not in checked and k not in given
            ]
            if missing:
                raise ConfigError(
                    f"data.options.{missing[0]} is required for data.name "
                    f"{shown(self.name)} (it takes {', '.join(sorted(schema))}); "
                    "got none"
                )


#: The keywords a model factory is given by dpfl when its signature takes them.
_MODEL_PASSED = {
    "input_shape": "the data (its records' shape)",
    "num_classes": "the data (its number of classes)",
}


def _sha256(v: Any) -> str | None:
    if v is None or (len(v) == 64 and all(c in "0123456789abcdef" for c in v)):
        return None
    return "must be null (take the file as it is) or 64 lowercase hex digits"


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """The model: a built-in one by ``name``, or the user's own by ``factory``.

    Attributes
    ----------
    name : str or None
        A name of :func:`dpfl.models.build_model` (``"mlp"`` when neither
        ``name`` nor ``factory`` is given).
    factory : str or None
        ``"package.module:function"``: a callable of the user's code that
        returns a ``torch.nn.Module``, imported from this Python's
        ``sys.path`` (:mod:`dpfl.experiments.factory`); called with
        ``options`` and, when its signature takes them, ``input_shape`` (one
        record's shape) and ``num_classes`` (of the data). Exclusive with
        ``name``.
    options : dict
        Keywords of the model class or of the factory, checked against its
        signature.
    factory_sha256 : str or None
        SHA-256 of the file that defines ``factory``. ``None``: filled in
        when the configuration is read (the run records it in ``config.yaml``
        and ``run.json``); given: the file must have it, else the
        configuration is refused naming the file (a run resumes only with
        the code it started with).
    """

    name: str | None = None
    factory: str | None = None
    options: dict[str, Any] = field(default_factory=dict)
    factory_sha256: str | None = field(None, _sha256)

    def __post_init__(self) -> None:
        if self.factory is None:
            if self.factory_sha256 is not None:
                raise ConfigError(
                    "model.factory_sha256 is read only with model.factory (the "
                    f"hash of the factory's file); got {shown(self.factory_sha256)}"
                )
            if self.name is None:
                object.__setattr__(self, "name", "mlp")
            from dpfl.models.registry import model_options

            schema = model_options(str(self.name))
            if schema is not None:  # an unknown name: build_model lists the names
                checked = check_options("model.options", self.options, schema, {})
                object.__setattr__(self, "options", checked)
            return
        if self.name is not None:
            raise ConfigError(
                "model.name and model.factory are exclusive (a built-in model, or "
                f"your own); got name {shown(self.name)} and factory "
                f"{shown(self.factory)}"
            )
        found = load_factory(self.factory, "model.factory", self.factory_sha256)
        checked = check_factory_options("model", found.obj, self.options, _MODEL_PASSED)
        object.__setattr__(self, "options", checked)
        object.__setattr__(self, "factory_sha256", found.sha256)

    @property
    def label(self) -> str:
        """How messages name the model: ``model 'mlp'``, ``model.factory 'm:f'``."""
        if self.factory is not None:
            return f"model.factory {self.factory!r}"
        return f"model {self.name!r}"

    def to_dict(self) -> dict[str, Any]:
        """Plain data: ``name`` and ``options`` (or ``factory`` in ``name``'s place).

        A factory's section also holds ``factory_sha256``.
        """
        if self.factory is None:
            return {"name": self.name, "options": dict(self.options)}
        return {
            "factory": self.factory,
            "options": dict(self.options),
            "factory_sha256": self.factory_sha256,
        }


@dataclasses.dataclass(frozen=True)
class LossConfig:
    """The training loss, from the user's code (absent: the built-in loss).

    Without a ``loss`` section the loss is
    :func:`dpfl.models.classification_loss` (softmax cross-entropy, or binary
    cross-entropy for a one-logit output).

    Attributes
    ----------
    factory : str
        ``"package.module:function"``: a callable that, called with
        ``options``, returns the loss ``loss(output, target)``, the batch's
        mean (e.g. ``"torch.nn:CrossEntropyLoss"`` with ``options:
        {label_smoothing: 0.1}``). Imported as ``model.factory`` is.
    options : dict
        Keywords of the factory, checked against its signature.
    factory_sha256 : str or None
        SHA-256 of the file that defines ``factory``, as
        ``model.factory_sha256``.
    """

    factory: str
    options: dict[str, Any] = field(default_factory=dict)
    factory_sha256: str | None = field(None, _sha256)

    def __post_init__(self) -> None:
        found = load_factory(self.factory, "loss.factory", self.factory_sha256)
        checked = check_factory_options("loss", found.obj, self.options, {})
        object.__setattr__(self, "options", checked)
        object.__setattr__(self, "factory_sha256", found.sha256)

    def to_dict(self) -> dict[str, Any]:
        """Plain data: ``factory``, ``options``, ``factory_sha256``."""
        return {
            "factory": self.factory,
            "options": dict(self.options),
            "factory_sha256": self.factory_sha256,
        }


def _build_loss_config(data: Any, prefix: str) -> LossConfig | None:
    if data is None:
        return None
    if not isinstance(data, Mapping):
        raise ConfigError(
            f"{prefix.rstrip('.')} must be a mapping (factory, options) or null; "
            f"got {shown(data)}"
        )
    if "factory" not in data:
        raise ConfigError(
            f"{prefix}factory is required in a loss section ('package.module:"
            "function'; leave the section out for the built-in loss); got none"
        )
    out: LossConfig = build_section(LossConfig, data, prefix)
    return out


@dataclasses.dataclass(frozen=True)
class AlgorithmConfig:
    """The federated algorithm and its parameters.

    ``params`` is the algorithm's own frozen parameters dataclass
    (:attr:`dpfl.sim.algorithms.base.FederatedAlgorithm.Params`): its fields,
    types, defaults and checks are the schema of this section. In YAML the
    parameters sit under ``params`` (or beside ``name``).

    Attributes
    ----------
    name : str
        A registered algorithm (:data:`dpfl.sim.algorithms.ALGORITHMS`).
    params : AlgorithmParams
        The algorithm's validated parameters.
    """

    name: str
    params: Any

    def to_dict(self) -> dict[str, Any]:
        """Plain data: ``{"name": ..., "params": {...}}``."""
        return {"name": self.name, "params": self.params.to_dict()}


def _build_algorithm_config(data: Mapping[str, Any], prefix: str) -> AlgorithmConfig:
    from dpfl.sim.algorithms import algorithm_class

    if not isinstance(data, Mapping):
        raise ConfigError(f"{prefix.rstrip('.')} must be a mapping; got {shown(data)}")
    data = dict(data)
    name = data.pop("name", "dsgd-rp")
    try:
        cls = algorithm_class(name)
    except InvalidParameterError as exc:
        raise ConfigError(f"{prefix}name: {exc}") from None
    params = data.pop("params", None) or {}
    if not isinstance(params, Mapping):
        raise ConfigError(f"{prefix}params must be a mapping; got {shown(params)}")
    twice = sorted(set(params) & set(data), key=str)
    if twice:
        key = twice[0]
        raise ConfigError(
            f"{prefix}{key} is given twice: beside name ({shown(data[key])}) and "
            f"under params ({shown(params[key])}); keep one"
        )
    params = {**params, **data}
    if "noise_multiplier" in params:
        raise ConfigError(
            f"{prefix}params.noise_multiplier is not an algorithm key: the noise "
            "multiplier lives in privacy.noise_multiplier (null: calibrate to the "
            f"budget; 0 with privacy.epsilon .inf: no noise); got "
            f"{shown(params['noise_multiplier'])}"
        )
    return AlgorithmConfig(
        name=cls.name, params=build_section(cls.Params, params, prefix + "params.")
    )


@dataclasses.dataclass(frozen=True)
class PrivacyConfig:
    """The run's total privacy budget and how it is priced.

    Attributes
    ----------
    epsilon : float
        Total ε for the worst-off privacy unit over the whole run (``inf``:
        no guard and no calibration; then ``noise_multiplier`` must be
        given).
    delta : float
        Total δ in [1e-15, 1); must be below 1/n for n privacy units (records or
        clients) unless ``allow_large_delta``.
    analysis : str or None
        The analysis that prices each round; ``None`` (default): the
        algorithm's scheme default, its tightest proven analysis. An analysis
        that is not proven (``paper``, ``cs``, random participation's
        ``sound``) needs ``allow_unproven``.
    noise_multiplier : float or None
        σ: noise std over the clip (the algorithm's main noise; schemes with
        several noises scale the others with it). ``None``: calibrate σ so that
        ``rounds`` rounds fit the budget. ``0``: a non-private run (no noise,
        no guarantee; labelled non-private everywhere), declared with
        ``epsilon: .inf``: a finite budget with no noise is refused.
    guard : str
        The stop rule. ``"accountant"`` (default): the ledger refuses the
        round whose bound under ``analysis`` would pass the budget.
        ``"moments-accountant"``: DP-FedAvg's own rule (Geyer et al.,
        Algorithm 1): Abadi et al.'s moments accountant with the cohort read as
        Poisson, stopping when δ at ``epsilon`` would pass ``delta`` = Q;
        ``"rdp"``: the same with the improved RDP conversion. Both only for
        ``dp-fedavg`` with fixed cohorts and a given noise multiplier, and,
        since the Poisson reading is not valid for fixed cohorts, with
        ``allow_unproven``.
    allow_unproven : bool
        Run although the reported ε is not a proven bound (an unproven
        analysis or guard, or DP-FedAvg's median clipping, whose clip bound is
        released without noise); every ε shown is then labelled and the
        proven ε is shown beside it.
    allow_large_delta : bool
        Accept δ >= 1/n (n privacy units): such a δ allows releasing one
        unit's data outright with probability δ, so it is refused by default.
    secure_noise : bool
        ``True`` (default): participants and noise come from the run's secret
        key (the run folder's ``secret.key``; never share it), through a
        cryptographically secure, floating-point-safe sampler. ``False``:
        reproducible noise from ``seed``, which anyone with this config can
        regenerate and subtract; labelled so in the report, not for release.
    """

    epsilon: float = field(4.0, epsilon_problem)
    delta: float = field(1e-5, delta_problem)
    analysis: str | None = field(None, one_of((None, *all_analyses())))
    noise_multiplier: float | None = field(None, noise_problem)
    guard: str = field("accountant", one_of(GUARDS))
    allow_unproven: bool = False
    allow_large_delta: bool = False
    secure_noise: bool = True


@dataclasses.dataclass(frozen=True)
class RayConfig:
    """Where and how wide ``execution: ray`` runs (other executions ignore it).

    The settings do not change the result: a run gives the same ledger and
    the same model (to float rounding) on any number of workers and nodes,
    so ``dpfl resume`` may continue a run with other settings.

    Attributes
    ----------
    address : str or None
        ``null`` (default): a private Ray instance on this machine, bound to
        127.0.0.1, started and stopped by the run. ``"auto"``: the cluster
        this machine joined with ``ray start``. ``"host:port"``: the cluster
        whose head node listens there (``ray start --head --port=...``).
    num_workers : int
        Ray actors; each runs one consecutive share of every round's cohort.
    num_cpus_per_worker : float
        CPUs each worker reserves (its torch uses as many threads, at least
        one); fractions share a CPU.
    num_gpus_per_worker : float
        GPUs each worker reserves; above 0 the workers compute on CUDA.
    """

    address: str | None = field(None, address_problem)
    num_workers: int = field(1, at_least(1))
    num_cpus_per_worker: float = field(1.0, finite_positive)
    num_gpus_per_worker: float = field(0.0, finite_nonnegative)


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """Everything a run needs; written resolved to ``runs/NAME/config.yaml``.

    Attributes
    ----------
    name : str
        Run name; the run writes to ``output_dir/name``.
    seed : int
        Seeds the partition, the model initialisation and every round.
    rounds : int
        Number of rounds T (the budget is for all T rounds).
    data, model, algorithm, privacy
        The sections.
    loss : LossConfig or None
        The training loss from the user's code (``None``: the built-in
        classification loss).
    eval_every : int
        Evaluate (and compute ε spent) every this many rounds (and at the end).
    checkpoint_every : int
        Save a checkpoint and the ledger every this many rounds (and at the end).
    output_dir : str
        Parent folder of the run folder.
    device : str
        ``"cpu"``, ``"cuda"`` or ``"auto"`` (CUDA when available).
    execution : str
        How client steps run: ``"batched"`` (the cohort as one vectorised
        computation, default), ``"loop"`` (one client at a time, the
        reference) or ``"ray"`` (shares of the cohort on Ray actors, set up
        by the ``ray`` section; ``pip install 'dpfl[ray]'``); all give the
        same model to float rounding and the same ledger.
    ray : RayConfig
        Where ``execution: ray`` runs (ignored by the other executions).
    max_clients : int or None
        Clients per chunk of a batched computation (bounds memory).
    """

    name: str = field("run", name_problem)
    seed: int = field(0, between(0, MAX_SEED))
    rounds: int = field(
        100,
        between(1, MAX_ROUNDS, " (the range the accounting answers in bounded time)"),
    )
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    loss: LossConfig | None = field(None, build=_build_loss_config)
    algorithm: AlgorithmConfig = field(
        default_factory=lambda: _build_algorithm_config({}, "algorithm."),
        build=lambda value, prefix: _build_algorithm_config(value or {}, prefix),
    )
    privacy: PrivacyConfig = field(default_factory=PrivacyConfig)
    eval_every: int = field(10, at_least(1))
    checkpoint_every: int = field(50, at_least(1))
    output_dir: str = field("runs", directory_problem)
    device: str = field("cpu", one_of(_DEVICES))
    execution: str = field("batched", one_of(EXECUTION_NAMES))
    ray: RayConfig = field(default_factory=RayConfig)
    max_clients: int | None = field(None, at_least(1))

    def __post_init__(self) -> None:
        priv = self.privacy
        if priv.noise_multiplier == 0 and not math.isinf(priv.epsilon):
            raise ConfigError(
                "privacy.noise_multiplier 0 adds no noise, so the run cannot keep "
                f"the budget privacy.epsilon {priv.epsilon:g}: declare a "
                "non-private run with privacy.epsilon: .inf and "
                "privacy.noise_multiplier: 0, or give a noise multiplier > 0 (or "
                "null, to calibrate); got noise_multiplier 0 with epsilon "
                f"{priv.epsilon:g}"
            )
        if math.isinf(priv.epsilon) and priv.noise_multiplier is None:
            raise ConfigError(
                "privacy.noise_multiplier must be given when privacy.epsilon is "
                "inf (there is no budget to calibrate to); got None"
            )
        if priv.guard != "accountant":
            # Which rounds the guard can stop is the scheme table's to say
            # (checked when the run's event is known, in plan_privacy).
            needs = {
                "privacy.analysis null (the guard's own rule)": priv.analysis is None,
                "a noise multiplier (privacy.noise_multiplier)": bool(
                    priv.noise_multiplier
                ),
                "privacy.allow_unproven true (a paper's stop rule is not a "
                "proven bound; e.g. DP-FedAvg's reads the fixed cohort as Poisson "
                "sampling)": (priv.allow_unproven),
            }
            missing = [k for k, ok in needs.items() if not ok]
            if missing:
                raise ConfigError(
                    f"privacy.guard {priv.guard!r} (a paper's stop rule) "
                    f"needs {', '.join(missing)}"
                )

    def to_dict(self) -> dict[str, Any]:
        """Return the configuration as plain data (YAML/JSON ready)."""
        out = dataclasses.asdict(self)
        out["model"] = self.model.to_dict()
        out["loss"] = None if self.loss is None else self.loss.to_dict()
        out["algorithm"] = self.algorithm.to_dict()
        return out

    def replace(self, **changes: Any) -> RunConfig:
        """Return a copy with top-level fields replaced (validated again)."""
        return config_from_dict({**self.to_dict(), **_plain(changes)})

    @property
    def run_dir(self) -> Path:
        """``output_dir / name``."""
        return Path(self.output_dir) / self.name


def _plain(changes: Mapping[str, Any]) -> dict[str, Any]:
    def plain(v: Any) -> Any:
        if isinstance(v, AlgorithmConfig | ModelConfig | LossConfig):
            return v.to_dict()
        is_instance = dataclasses.is_dataclass(v) and not isinstance(v, type)
        return dataclasses.asdict(v) if is_instance else v

    return {k: plain(v) for k, v in changes.items()}


def config_from_dict(
    data: Mapping[str, Any] | None, overrides: Sequence[str] = ()
) -> RunConfig:
    """Validate plain data (plus overrides) into a :class:`RunConfig`.

    Parameters
    ----------
    data : mapping or None
        The configuration tree; missing keys take their defaults.
    overrides : sequence of str
        ``"key.sub=value"`` items applied first.

    Returns
    -------
    RunConfig
        The validated configuration.

    Raises
    ------
    ConfigError
        On an unknown key (with the closest known one), a wrong type or an
        out-of-range value; the message names the dotted key and the value.
    """
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise ConfigError(f"a configuration must be a mapping; got {shown(data)}")
    tree = apply_overrides(data, overrides)
    check_numbers(tree, "")
    return build_section(RunConfig, tree)


def load_config(path: str | Path, overrides: Sequence[str] = ()) -> RunConfig:
    """Read a YAML run configuration and apply ``--set`` overrides.

    Parameters
    ----------
    path : str or Path
        The YAML file.
    overrides : sequence of str
        ``"key.sub=value"`` items; values are parsed as YAML.

    Returns
    -------
    RunConfig
        The validated configuration.

    Raises
    ------
    ConfigError
        If the file is missing or not YAML, or on an invalid key or value.
    """
    return config_from_dict(read_config_file(path), overrides)
